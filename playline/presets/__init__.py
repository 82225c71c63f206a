"""Catalog presets for real providers: ``include = ["hunter"]`` in a catalog pulls one in.

Each ``<vendor>.toml`` here declares one vendor's provider (real ``base_url``, a
``<VENDOR>_BASE_URL`` override, the key in ``<VENDOR>_API_KEY``, the documented pacing)
and its tools, with the billing rule the vendor documents, so the credits playline
records match the vendor's invoice. Every entry cites the page it was written from
in ``source``, and the comments say what the docs left out (and what was assumed).
The local provider server answers in each vendor's shape under ``/<vendor>`` so the
presets are tested over real HTTP (``tests/integration/test_presets.py``).

``waterfalls.toml`` declares no provider: it names waterfalls (work email, verified work
email, mobile phone) over the other presets' tools, so it is included together with
them. ZeroBounce, NeverBounce and MillionVerifier take their keys in the query string
(``auth.query``), which playline keeps out of every log.
"""
