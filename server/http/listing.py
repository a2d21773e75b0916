"""Sorting, filtering, pagination and ``columns=`` of list replies, as rabbit_mgmt_util does.

* ``sort=a.b`` sorts by that (dotted) field first, then by the list's default fields;
  ``sort=`` (empty) leaves the order alone; ``sort_reverse=true`` reverses it. Fields compare
  in Erlang's term order, which RabbitMQ's lists follow: numbers < true/false/null < objects
  < arrays < strings; a missing field counts as 0.
* ``page`` (from 1) and ``page_size`` (default 100, at most 500) page the sorted list, after
  ``name`` filtered it (a case-insensitive substring, or with ``use_regex=true`` a regex) on
  the items' names; the reply then wraps the page in counts and ``items``.
* ``columns=a,b.c`` keeps only those fields (of each item, or of each page item).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from .errors import ApiError

PAGE_SIZE_DEFAULT = 100
PAGE_SIZE_MAX = 500
# A filter regex is compiled per request; a bound keeps a hostile one cheap to compile.
NAME_FILTER_CHARS_MAX = 1024

Entry = TypeVar("Entry")


def _invalid(error: str, reason: str) -> ApiError:
    return ApiError(400, error, reason)


def pagination(query: Mapping[str, str]) -> tuple[int, int] | None:
    """(page, page size) when the query asks for a page; 400 when it asks wrongly."""
    page_text = query.get("page")
    size_text = query.get("page_size")
    try:
        page = None if page_text is None else int(page_text)
        size = None if size_text is None else int(size_text)
    except ValueError:
        raise _invalid("bad_request", "Pagination parameters are invalid") from None
    if page is None:
        return None
    if size is None:
        size = PAGE_SIZE_DEFAULT
    if page > 0 and 0 < size <= PAGE_SIZE_MAX:
        return page, size
    raise _invalid(
        "invalid_pagination_parameters",
        f"Invalid pagination parameters: page number {page}, page size {size}",
    )


def _term_key(value: Any) -> tuple:
    """A sort key in Erlang's term order for a JSON value."""
    if value.__class__ is str:  # the commonest sort field, first
        return (4, value)
    if isinstance(value, bool) or value is None:
        return (1, "true" if value is True else "false" if value is False else "null")
    if isinstance(value, int | float):
        return (0, value)
    if isinstance(value, Mapping):
        return (2, repr(sorted(value.items(), key=lambda item: item[0])))
    if isinstance(value, list | tuple):
        return (3, tuple(_term_key(item) for item in value))
    return (4, str(value))


def _dotted(item: Mapping[str, Any], path: str) -> Any:
    """The field at a dotted path; 0 when any part of it is missing."""
    value: Any = item
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return 0
        value = value[key]
    return value


def sort_items(
    items: list[dict[str, Any]], defaults: Sequence[str], query: Mapping[str, str]
) -> list[dict[str, Any]]:
    sort = query.get("sort")
    if sort == "":
        ordered = items
    else:
        fields = [sort, *defaults] if sort is not None else list(defaults)
        ordered = sorted(items, key=lambda item: [_term_key(_dotted(item, f)) for f in fields])
    if query.get("sort_reverse") == "true":
        ordered = ordered[::-1]
    return ordered


def _name_filter(query: Mapping[str, str]):
    name = query.get("name")
    if not name:
        return None
    if len(name) > NAME_FILTER_CHARS_MAX:
        raise _invalid("bad_request", f"name filter longer than {NAME_FILTER_CHARS_MAX}")
    if query.get("use_regex") == "true":
        try:
            pattern = re.compile(name, re.IGNORECASE)
        except re.error as error:
            raise _invalid("bad_request", f"invalid regular expression: {error}") from None
        return lambda value: pattern.search(value) is not None
    lowered = name.lower()
    return lambda value: lowered in value.lower()


def page(items: list[dict[str, Any]], query: Mapping[str, str], requested: tuple[int, int]):
    number, size = requested
    matches = _name_filter(query)
    filtered = items if matches is None else [i for i in items if matches(str(i.get("name")))]
    start = (number - 1) * size
    if start > len(filtered):
        raise _invalid(
            "page_out_of_range",
            f"Page out of range, page: {number} page size: {size}, len: {len(filtered)}",
        )
    shown = filtered[start : start + size]
    return {
        "total_count": len(items),
        "item_count": len(shown),
        "filtered_count": len(filtered),
        "page": number,
        "page_size": size,
        "page_count": (len(filtered) + size - 1) // size,
        "items": shown,
    }


def columns(query: Mapping[str, str]) -> list[list[str]] | None:
    text = query.get("columns")
    if text is None:
        return None
    return [[key for key in column.split(".") if key] for column in text.split(",") if column]


def keep_columns(value: Any, wanted: list[list[str]]) -> Any:
    """`value` with only the wanted (dotted) fields of each object."""
    if isinstance(value, list):
        return [keep_columns(item, wanted) for item in value]
    if not isinstance(value, Mapping):
        return value
    kept = {}
    for key, field in value.items():
        paths = [path for path in wanted if path and path[0] == key]
        if not paths:
            continue
        rests = [path[1:] for path in paths]
        kept[key] = field if any(not rest for rest in rests) else keep_columns(field, rests)
    return kept


def listing(
    items: list[dict[str, Any]],
    defaults: Sequence[str],
    query: Mapping[str, str],
    *,
    pageable: bool,
) -> Any:
    """A list reply: sorted, filtered and paged (where RabbitMQ pages it), then cut to the
    requested columns."""
    requested = pagination(query) if pageable else None
    reply: Any = sort_items(items, defaults, query)
    wanted = columns(query)
    if requested is not None:
        reply = page(reply, query, requested)
        if wanted is not None:
            reply["items"] = keep_columns(reply["items"], wanted)
        return reply
    return reply if wanted is None else keep_columns(reply, wanted)


def listing_built_per_page(
    entries: Sequence[Entry],
    keys: Callable[[Entry], dict[str, Any]],
    build: Callable[[Entry], dict[str, Any]],
    defaults: Sequence[str],
    query: Mapping[str, str],
) -> Any:
    """`listing` of `build(entry)` for each entry, where a page whose order `keys(entry)` (the
    default sort fields, "name" among them) decides alone builds only its own items: a
    console polling one page of 1,000 queues pays for 100 (and samples only their rates)."""
    requested = pagination(query)
    sort = query.get("sort")
    if requested is None or (sort and sort not in defaults):
        return listing([build(entry) for entry in entries], defaults, query, pageable=True)
    light = [keys(entry) for entry in entries]
    entry_of = {id(key): entry for key, entry in zip(light, entries, strict=True)}
    reply = page(sort_items(light, defaults, query), query, requested)
    reply["items"] = [build(entry_of[id(key)]) for key in reply["items"]]
    wanted = columns(query)
    if wanted is not None:
        reply["items"] = keep_columns(reply["items"], wanted)
    return reply
