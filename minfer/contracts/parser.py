"""Parse an FKC contract file (seed 004): markdown + YAML front matter + fenced ```fkc blocks.

The file is split by hand (front matter between the first two `---` lines, one section per
```fkc ... ``` fence, the nearest preceding `#` heading kept as the section's heading), each
YAML text is loaded with PyYAML's safe loader, and every section becomes a typed
`KernelContract` (schema.py). Line numbers of every field are recorded from the YAML node
marks, so validation errors can point at a line.

Problems found here (unreadable file, YAML syntax, unclosed fence, duplicate keys, YAML aliases)
are collected as `ContractError`s in `ContractFile.parse_errors` rather than raised, so one bad
block does not hide the others; `validate.validate_file` reports them with the rest.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import ContractError
from .schema import ContractFile, Location, build_provider, build_section

MAX_FILE_BYTES = 1 << 20
HEADER_SECTION = "<front matter>"


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where PyYAML has it: ~10x faster


class _YamlProblem(Exception):
    def __init__(self, line: int, reason: str, rule: str = "YamlSyntax"):
        super().__init__(reason)
        self.line, self.reason, self.rule = line, reason, rule


def _load(text: str, first_line: int) -> tuple[object, dict[str, int]]:
    """YAML value of `text` and a map of dotted field path -> 1-based file line."""
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        lines: dict[str, int] = {}
        if node is not None:
            _walk(node, "", lines, first_line, set())
        value = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = first_line + (mark.line if mark else 0)
        raise _YamlProblem(line, f"{e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise _YamlProblem(first_line, str(e)) from None
    finally:
        loader.dispose()
    return value, lines


def _walk(node: yaml.Node, path: str, lines: dict[str, int], base: int, seen: set[int]) -> None:
    """Record line numbers; reject aliases (shared nodes) and duplicate mapping keys."""
    if id(node) in seen:
        raise _YamlProblem(base + node.start_mark.line, "YAML anchors/aliases are not allowed in contracts")
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys: set[str] = set()
        for k, v in node.value:
            key = str(k.value)
            if key in keys:
                raise _YamlProblem(base + k.start_mark.line, f"duplicate key {key!r}", "DuplicateField")
            keys.add(key)
            sub = f"{path}.{key}" if path else key
            lines[sub] = base + k.start_mark.line
            _walk(v, sub, lines, base, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            sub = f"{path}[{i}]"
            lines[sub] = base + v.start_mark.line
            _walk(v, sub, lines, base, seen)


def parse_text(text: str, path: str = "<text>") -> ContractFile:
    """Parse the text of an .fkc.md file. Never raises for bad content: see `parse_errors`."""
    errors: list[ContractError] = []

    def err(rule: str, section: str, field: str, reason: str, line: int) -> None:
        e = ContractError(rule, section, field, f"{reason} ({path}:{line})")
        e.line = line
        errors.append(e)

    src = text.splitlines()
    header_raw: dict = {}
    header_lines: dict[str, int] = {}
    start = 0
    if src and src[0].strip() == "---":
        end = next((i for i in range(1, len(src)) if src[i].strip() == "---"), None)
        if end is None:
            err("FrontMatterMissing", HEADER_SECTION, "---", "front matter is not closed by a '---' line", 1)
        else:
            start = end + 1
            try:
                value, header_lines = _load("\n".join(src[1:end]), 2)
            except _YamlProblem as p:
                err(p.rule, HEADER_SECTION, "<yaml>", p.reason, p.line)
                value = {}
            if isinstance(value, dict):
                header_raw = value
            else:
                err("FieldType", HEADER_SECTION, "<front matter>", "front matter must be a YAML mapping", 2)
    else:
        err("FrontMatterMissing", HEADER_SECTION, "---", "file must start with a '---' YAML front matter", 1)

    sections = []
    heading = ""
    i = start
    while i < len(src):
        line = src[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.strip() == "```fkc":
            end = next((j for j in range(i + 1, len(src)) if src[j].strip() == "```"), None)
            label = heading.split(" ")[0] if heading else f"<block at line {i + 2}>"
            if end is None:
                err("FenceUnclosed", label, "```fkc", "fkc block has no closing ``` line", i + 1)
                break
            try:
                value, lines = _load("\n".join(src[i + 1 : end]), i + 2)
            except _YamlProblem as p:
                err(p.rule, label, "<yaml>", p.reason, p.line)
            else:
                if isinstance(value, dict):
                    sections.append(build_section(value, Location(path, i + 2, heading), lines))
                else:
                    err("FieldType", label, "<block>", "an fkc block must be a YAML mapping", i + 2)
            i = end
        i += 1
    if not sections and not errors:
        err("NoSections", HEADER_SECTION, "```fkc", "file holds no ```fkc section", 1)
    return ContractFile(
        path=path,
        fkc_version=header_raw.get("fkc_version"),
        provider=build_provider(header_raw),
        header_raw=header_raw,
        header_lines=header_lines,
        sections=tuple(sections),
        parse_errors=tuple(errors),
    )


def parse_file(path: str | Path) -> ContractFile:
    """Parse an .fkc.md file; an unreadable or oversized file becomes a `FileUnreadable` error."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise OSError(f"{size} bytes is more than the {MAX_FILE_BYTES}-byte limit for a contract file")
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        error = ContractError("FileUnreadable", HEADER_SECTION, str(p), str(e))
        error.line = 0
        return ContractFile(str(p), None, None, {}, {}, (), (error,))
    return parse_text(text, str(p))
