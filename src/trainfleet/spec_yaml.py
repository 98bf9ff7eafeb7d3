"""YAML loading that remembers the line of every mapping key, so errors can name it.

    >>> doc = load_yaml_with_lines("a: 1\\nb:\\n  c: 2\\n", "x.yaml")
    >>> doc["b"].line_of("c")
    3

Only the safe YAML subset is accepted (no Python objects). Every problem, a value a tag cannot
read (`!!int ""`, `!!bool x`) included, is a SpecError naming the file and line.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from trainfleet.errors import SpecError


class LineDict(dict):
    """A dict from YAML that knows the 1-based line of each key and of itself."""

    __slots__ = ("key_lines", "line")

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int] = {}

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line)


class LineList(list):
    """A list from YAML that knows the 1-based line of each item."""

    __slots__ = ("item_lines", "line")

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.item_lines: list[int] = []


MAX_DEPTH = 100
"""Deepest nesting read; deeper is an error on its line (not a RecursionError somewhere)."""

# What PyYAML's constructors raise on a value they cannot read: `!!int ""` an IndexError,
# `!!bool x` a KeyError, `!!timestamp x` an AttributeError, `!!int 0x` a ValueError.
_VALUE_ERRORS = (ValueError, TypeError, AttributeError, ArithmeticError, LookupError)
_YAML_TAG = "tag:yaml.org,2002:"
# Where YAML ends a line (the lines its marks count).
_LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")


def _tag(node: yaml.Node) -> str:
    return node.tag.replace(_YAML_TAG, "!!", 1) if node.tag.startswith(_YAML_TAG) else node.tag


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    return "a sequence" if isinstance(node, yaml.SequenceNode) else "a scalar"


class _LineLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def _error(self, node: yaml.Node, problem: str, fix: str) -> SpecError:
        return SpecError(self.name, node.start_mark.line + 1, problem, fix)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise SpecError(
                    self.name,
                    self.peek_event().start_mark.line + 1,
                    f"YAML nested more than {MAX_DEPTH} levels deep",
                    "flatten the document",
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_document(self, node: yaml.Node) -> Any:
        # Deep from the root: every constructor (a `!!set`'s too) then runs inside
        # construct_object below, which knows the node and so the line.
        self.deep_construct = True
        return super().construct_document(node)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except _VALUE_ERRORS as exc:
            value = f"{node.value[:40]!r}" if isinstance(node, yaml.ScalarNode) else _kind(node)
            detail = f" ({exc})" if isinstance(exc, ValueError | ArithmeticError) else ""
            raise self._error(
                node,
                f"{value} is not a valid {_tag(node)}{detail}",
                f"fix the value, or drop the {_tag(node)} tag",
            ) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> LineDict:
        if not isinstance(node, yaml.MappingNode):
            raise self._error(
                node, f"{_tag(node)} needs a mapping, got {_kind(node)}", "fix the value or tag"
            )
        mapping = LineDict(node.start_mark.line + 1)
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool) and key is not None:
                raise SpecError(
                    self.name,
                    key_node.start_mark.line + 1,
                    "mapping keys must be plain names",
                    "write `key: value` pairs",
                )
            if key in mapping:
                raise SpecError(
                    self.name,
                    key_node.start_mark.line + 1,
                    f"key {key!r} appears twice in the same mapping",
                    "keep one of them",
                )
            mapping[key] = self.construct_object(value_node, deep=True)
            mapping.key_lines[key] = key_node.start_mark.line + 1
        return mapping

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> LineList:
        if not isinstance(node, yaml.SequenceNode):
            raise self._error(
                node, f"{_tag(node)} needs a sequence, got {_kind(node)}", "fix the value or tag"
            )
        items = LineList(node.start_mark.line + 1)
        for child in node.value:
            items.append(self.construct_object(child, deep=True))
            items.item_lines.append(child.start_mark.line + 1)
        return items


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _LineLoader.construct_sequence)


def load_yaml_with_lines(text: str, source: str) -> Any:
    """Parse `text`; any YAML problem becomes a SpecError naming `source` and the line."""
    loader = None
    try:
        loader = _LineLoader(text)
        loader.name = source
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise SpecError(
            source, line, f"not valid YAML ({exc.problem})", "fix the YAML syntax there"
        ) from None
    except yaml.reader.ReaderError as exc:
        # The reader checks the whole text before parsing: its position is a character index.
        line = len(_LINE_BREAK.findall(text, 0, exc.position)) + 1
        raise SpecError(
            source,
            line,
            f"not valid YAML (character #x{exc.character:04x}: {exc.reason})",
            "remove the character or write it as an escape in a double-quoted string",
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(source, None, f"not valid YAML ({exc})", "fix the YAML syntax") from None
    except ValueError as exc:  # PyYAML's scanner turns `"\U00110000"` into chr() of it
        line = loader.line + 1 if loader else None
        raise SpecError(
            source,
            line,
            f"not valid YAML ({exc})",
            "write a character escape as \\U0010FFFF or lower",
        ) from None
    except RecursionError:
        line = loader.line + 1 if loader else None
        raise SpecError(source, line, "YAML nested too deeply", "flatten the document") from None
    finally:
        if loader is not None:
            loader.dispose()
