"""``python -m playline`` is the ``playline`` command."""

from playline.cli import entrypoint

entrypoint()
