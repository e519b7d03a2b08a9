"""``manage.py configreference [--out FILE]``: the configuration reference, as Markdown,
written from ``runtime.conf`` (``docs/reference/configuration.md`` is this command's output;
a test keeps the two equal)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand

from runtime import conf

HEADER = """# Configuration

Every setting is an environment variable, read once at start-up by `runtime.conf`: a bad
value stops `manage.py` (and the WSGI server) with one line naming the variable and what it
accepts. An unset or empty variable takes its default. A project that embeds the runtime app
in its own Django settings sets `RUNTIME` (the second table) instead; `manage.py check`
reports a key it does not know or a value it does not accept (`runtime.E002`).

This page is generated: `manage.py configreference --out docs/reference/configuration.md`.
"""


def _shown(value: Any) -> str:
    if value in (None, "", [], {}):
        return "—"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    return text if text in ("—", "(secret)") else f"`{text}`"


def reference() -> str:
    """The reference page's Markdown."""
    out = [HEADER]
    for group, title in conf.GROUPS.items():
        out.append(f"\n## {title}\n")
        out.append("| Variable | Accepts | Default | What it does |")
        out.append("|---|---|---|---|")
        for v in conf.VARIABLES:
            if v.group == group:
                default = "(secret)" if v.secret and v.default else _shown(v.default)
                key = f" Sets `RUNTIME[\"{v.key}\"]`." if v.key else ""
                out.append(f"| `{v.name}` | {_cell(v.kind.accepted)} | {_code(default)} | "
                           f"{_cell(v.help)}{key} |")
    out.append("\n## `RUNTIME` (Django settings)\n")
    out.append("| Key | Default | What it is |")
    out.append("|---|---|---|")
    for k in conf.KEYS:
        default = json.dumps(k.default) if isinstance(k.default, dict | list) else _shown(
            k.default)
        variable = f" (`{k.variable}`)" if k.variable else ""
        out.append(f"| `{k.name}`{variable} | {_code(default)} | {_cell(k.help)} |")
    return "\n".join(out) + "\n"


class Command(BaseCommand):
    help = "Print (or write) the configuration reference, generated from runtime.conf."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--out", help="write it to this file instead of printing it")

    def handle(self, *args: Any, **opts: Any) -> None:
        text = reference()
        if opts["out"]:
            Path(opts["out"]).write_text(text)
        else:
            self.stdout.write(text, ending="")
