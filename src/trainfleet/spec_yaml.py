"""YAML loading that remembers the line of every mapping key, so errors can name it.

    >>> doc = load_yaml_with_lines("a: 1\\nb:\\n  c: 2\\n", "x.yaml")
    >>> doc["b"].line_of("c")
    3

Only the safe YAML subset is accepted (no tags, no Python objects).
"""

from __future__ import annotations

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


class _LineLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> LineDict:  # type: ignore[override]
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

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> LineList:  # type: ignore[override]
        items = LineList(node.start_mark.line + 1)
        for child in node.value:
            items.append(self.construct_object(child, deep=True))
            items.item_lines.append(child.start_mark.line + 1)
        return items


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _LineLoader.construct_sequence)


def load_yaml_with_lines(text: str, source: str) -> Any:
    """Parse `text`; any YAML problem becomes a SpecError naming `source` (and the line)."""
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
    except yaml.YAMLError as exc:
        raise SpecError(source, None, f"not valid YAML ({exc})", "fix the YAML syntax") from None
    except RecursionError:
        raise SpecError(source, None, "YAML nested too deeply", "flatten the document") from None
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        # PyYAML's constructors raise these for values like `!!int x` or an impossible date.
        raise SpecError(
            source, None, f"a value cannot be read ({exc})", "fix or quote the value"
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
