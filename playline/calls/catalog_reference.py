"""The catalog reference: every key of a provider catalog, written from its models.

``docs/catalog.md`` is this module's output, never edited by hand::

    playline catalog reference --out docs/catalog.md

Each table of the catalog TOML is a pydantic model (:class:`~playline.calls.catalog.Catalog`
and the models its fields hold); each key's type, default and limits are read from
the model's fields and its meaning from the field's ``description`` (the docstring
written under the field, see :class:`~playline.spec_model.SpecModel`), so the reference
changes when a model does. What the models do not declare (``include``, read by
``_with_presets`` before validation, and the shorthands their validators accept) is
written here by hand, under a heading that says so.
``tests/unit/test_catalog_reference.py`` checks that the committed file is what this
module writes now and that every field has a description.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from playline.calls.catalog import Catalog, ToolSpec, preset_names

__all__ = ["REGENERATE", "Section", "catalog_models", "render", "sections"]

#: The command that rewrites the committed reference.
REGENERATE = "playline catalog reference --out docs/catalog.md"

#: Defaults a validator fills in from elsewhere, where the field's own would mislead
#: (see ``Catalog._fill_tool_ids``); written by hand, like the last section.
_DEFAULT_BY_HAND: dict[tuple[type[BaseModel], str], str] = {
    (ToolSpec, "id"): "filled in: the table's name",
    (ToolSpec, "idempotency"): "the provider's `idempotency`",
}


@dataclass
class Section:
    """One model of the catalog and every place in the TOML where it stands."""

    model: type[BaseModel]
    places: list[str] = field(default_factory=list)


def sections(root: type[BaseModel] = Catalog) -> list[Section]:
    """The catalog's models, the root first, each once, in the order the TOML nests them."""
    found: dict[type[BaseModel], Section] = {}

    def visit(model: type[BaseModel], place: str) -> None:
        section = found.get(model)
        if section is not None:
            if place not in section.places:  # two kinds of one table share a key
                section.places.append(place)
            return
        found[model] = Section(model, [place])
        for name, info in model.model_fields.items():
            key = info.alias or name
            for inner, suffix in _nested_models(info.annotation):
                visit(inner, f"{place}.{key}{suffix}" if place else f"{key}{suffix}")

    visit(root, "")
    return list(found.values())


def catalog_models() -> list[type[BaseModel]]:
    """Every model a catalog file is validated with."""
    return [section.model for section in sections()]


def _nested_models(annotation: Any, suffix: str = "") -> Iterator[tuple[type[BaseModel], str]]:
    """The models inside a field's type, with how the TOML reaches them from the key."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, suffix
        return
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:  # a discriminated union: its models
        yield from _nested_models(args[0], suffix)
    elif origin is dict:
        yield from _nested_models(args[1], f"{suffix}.<name>")
    elif origin in (list, tuple):
        yield from _nested_models(args[0], f"{suffix}[]")
    elif origin in (Union, types.UnionType):
        for arg in args:
            yield from _nested_models(arg, suffix)


def render() -> str:
    """The whole reference, as Markdown."""
    parts = sections()
    lines = [
        "# Provider catalog reference",
        "",
        "<!-- Generated from the catalog's pydantic models by playline.calls.catalog_reference;",
        f"     do not edit. Regenerate with: {REGENERATE} -->",
        "",
        "A provider catalog is one TOML file (`PLAYLINE_CATALOG`; the demo's when unset) that",
        "declares the providers a worker may call, their tools and their waterfalls. It is",
        "validated as a whole when it is loaded: a bad catalog is refused, with every problem",
        "named, before any play starts. This page lists every key the file may hold, table by",
        "table, from the models that validate it.",
        "",
        "An example (from `playline/calls/catalog.py`):",
        "",
        "```toml",
        *_example(),
        "```",
        "",
        "Tables:",
        "",
    ]
    for section in parts:
        name = section.model.__name__
        lines.append(f"- [{name}](#{name.lower()}): {_where(section)}")
    lines += ["- [Read by hand, not by a model](#read-by-hand-not-by-a-model)", ""]
    for section in parts:
        lines += _section(section)
    lines += _by_hand()
    return "\n".join(lines).rstrip("\n") + "\n"


def _where(section: Section) -> str:
    if section.places == [""]:
        return "the file itself"
    return ", ".join(f"`{place}`" for place in section.places)


def _section(section: Section) -> list[str]:
    model = section.model
    lines = [
        f"## {model.__name__}",
        "",
        f"Where: {_where(section)}. Model: `{model.__module__}.{model.__qualname__}`.",
        "",
        _prose(_summary(model)),
        "",
    ]
    if model.model_config.get("extra") == "forbid":
        lines += ["Any other key is refused.", ""]
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        key = info.alias or name
        meaning = " ".join((info.description or "").split())  # a docstring's lines, as one
        default = _DEFAULT_BY_HAND.get((model, name)) or _default(info)
        cells = [f"`{key}`", _type(info), default, _prose(meaning)]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    lines.append("")
    return lines


def _by_hand() -> list[str]:
    """What no model field declares: written here from the parsing code, kept short."""
    presets = ", ".join(f"`{name}`" for name in preset_names())
    return [
        "## Read by hand, not by a model",
        "",
        "These keys and shorthands are handled by code before or inside validation, not",
        "declared as model fields, so this section is written by hand in",
        "`playline/calls/catalog_reference.py` from that code; keep it in step with it.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
        "| `include` (top level) | array of string | `[]` | presets shipped with playline"
        f" (`playline/presets/`: {presets}) whose `providers`, `tools` and `waterfalls` are"
        " merged under the file's own; the file's tools and waterfalls win over a preset's of"
        " the same name, and its `[providers.<name>]` table is merged key by key over the"
        " preset's (its keys win: `plan = \"basic\"` alone picks another plan). A preset's"
        " own `include` is followed one level (its presets merged under it: `include ="
        ' ["waterfalls"]` stands alone). Read by `_with_presets` in'
        " `playline/calls/catalog.py`. |",
        "",
        "Shorthands (from the models' validators):",
        "",
        "- `tools.<name>.id` is filled in from the table's name; a catalog does not write it.",
        "- `tools.<name>.idempotency`, when the tool does not state it, is its provider's"
        " `idempotency` (`Catalog._fill_tool_ids`).",
        '- `tools.<name>.fresh_for` may be one duration (`"90d"`, seconds) for every'
        " answer instead of a table; its `rule` key is refused in a catalog.",
        "- `providers.<name>.auth.env` may be one variable (a string) or a list of them;"
        " `auth.header` is `Authorization` unless `auth.query` is set (exactly one of the"
        " two carries the key).",
        '- `tools.<name>.error_field` may be one field (`"error"`): any present value of it'
        ' rejects the call (`{ field = "error", any = "rejected" }`).',
        "- `providers.<name>.plan` fills `pacing`, `key_pacing`, `credit_price` and `currency`"
        " from `plans.<plan>` where the provider table does not set them"
        " (`ProviderSpec._apply_plan`); an unknown plan, or plans without a `plan`, is an"
        " error naming the plans.",
        '- `waterfalls.<name>.steps` may name a step by its tool id alone (`"hunter_email"`'
        ' is `{ tool = "hunter_email" }`).',
        "- Durations (`found`, `no_match`, `by_value`) are seconds or text: a number with"
        ' `s`, `m`, `h`, `d` or `w` (`"14d"`, `"12h"`).',
        "",
        "Checks across tables: a tool names a declared provider, a waterfall names declared"
        " tools, a tool declares at most one of `batch` and `job`, a job tool has no"
        " `no_match_status`, and no input field of a tool is named as its provider's"
        " `auth.query`.",
    ]


def _summary(model: type[BaseModel]) -> str:
    """The first paragraph of the model's docstring."""
    doc = inspect.cleandoc(model.__doc__ or "")
    return doc.split("\n\n", 1)[0].replace("\n", " ")


def _prose(text: str) -> str:
    """reST markup as Markdown: ``code`` and :role:`~path.Name` become `code`."""
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?([\w]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _type(info: FieldInfo) -> str:
    words = _type_words(info.annotation)
    limits = [_limit(item, text=info.annotation is str) for item in info.metadata]
    return ", ".join([words, *(limit for limit in limits if limit)])


def _type_words(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        name = annotation.__name__
        return f"[{name}](#{name.lower()}) table"
    simple = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}
    if annotation in simple:
        return simple[annotation]
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        return _type_words(args[0])
    if origin is Literal:
        return " or ".join(_toml(arg) for arg in args)
    if origin is dict:
        return f"table of {_plural(_type_words(args[1]))}"
    if origin in (list, tuple):
        return f"array of {_plural(_type_words(args[0]))}"
    if origin in (Union, types.UnionType):
        return " or ".join(_type_words(arg) for arg in args if arg is not type(None))
    raise TypeError(f"the catalog reference cannot name the type {annotation!r}")


def _plural(words: str) -> str:
    if words.endswith(" table"):
        return f"{words}s"
    return {"string": "strings", "number": "numbers", "array of any": "arrays"}.get(words, words)


def _limit(item: Any, *, text: bool) -> str:
    if isinstance(item, annotated_types.Ge):
        return f">= {_toml(item.ge)}"
    if isinstance(item, annotated_types.Gt):
        return f"> {_toml(item.gt)}"
    if isinstance(item, annotated_types.Le):
        return f"<= {_toml(item.le)}"
    if isinstance(item, annotated_types.Lt):
        return f"< {_toml(item.lt)}"
    unit = "characters" if text else "items"
    if isinstance(item, annotated_types.MinLen):
        return "not empty" if item.min_length == 1 else f"at least {item.min_length} {unit}"
    if isinstance(item, annotated_types.MaxLen):
        return f"at most {item.max_length} {unit}"
    return ""


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    return f"`{_toml(value)}`"


def _toml(value: Any) -> str:
    """A default as it would be written in the TOML file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_defaults=True, by_alias=True)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"the catalog reference cannot write the default {value!r}")


def _example() -> list[str]:
    """The TOML example of :mod:`playline.calls.catalog`'s docstring."""
    from playline.calls import catalog

    match = re.search(r"```toml\n(.*?)```", catalog.__doc__ or "", re.DOTALL)
    assert match is not None, "playline/calls/catalog.py's docstring lost its TOML example"
    return match.group(1).rstrip("\n").split("\n")
