"""Reading the documentation's code blocks, shared by the tests that check the docs."""

from __future__ import annotations

import shlex


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block of ``text``."""
    out: list[tuple[str, str]] = []
    current: list[str] | None = None
    info = ""
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current, info = [], line[3:].strip()
            else:
                out.append((info, "\n".join(current) + "\n"))
                current = None
        elif current is not None:
            current.append(line)
    return out


def code_blocks(text: str, lang: str = "") -> list[str]:
    """Bodies of the blocks whose info string is ``lang`` ("" for plain shell blocks)."""
    return [body for info, body in fenced_blocks(text) if info == lang]


def crowdmix_commands(text: str) -> list[list[str]]:
    """Arguments of the ``crowdmix`` command lines of the plain shell blocks: continuations
    joined, comments cut, and ``[...]`` (optional parts in the prose) dropped."""
    commands = []
    for info, body in fenced_blocks(text):
        if info not in ("", "sh", "shell", "console"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if not line or "▶" in line:  # a diagram, not a command
                continue
            words = shlex.split(line)
            if words[0] not in ("crowdmix", "scripts/crowdmix"):
                continue
            cleaned, depth = [], 0
            for w in words[1:]:
                depth += w.count("[")
                if depth == 0:
                    cleaned.append(w)
                depth -= w.count("]")
            commands.append(cleaned)
    return commands


def registry_example() -> str:
    """The example registry of docs/operating.md (its one ``toml`` block), as TOML text."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "operating.md").read_text()
    (block,) = code_blocks(page, "toml")
    return block
