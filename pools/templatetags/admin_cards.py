"""Every changelist of the admin fits the screen (issue 47 point 7), through its one row template,
templates/admin/change_list_results.html:

- each cell of a result row carries its column's name (`data-label`), which pools/static/pools/admin.css
  writes before the value when the table stacks into cards on a phone;
- a value's text may wrap after a slash or an underscore (`<wbr>`): a model id
  (`anthropic/claude-opus-4-8`), an outcome code (`upstream_dispatch_unknown`), a route, which have no
  other break opportunity and would otherwise widen their column past the results box. The text, as
  read and copied, is unchanged."""

import re

from django import template
from django.utils.html import format_html, strip_tags
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

# A text node of the cell's HTML (attribute values cannot hold `<` or `>`: the admin escapes them).
TEXT = re.compile(r">([^<>]+)<")


def _breakable(cell: str) -> str:
    return TEXT.sub(lambda m: ">" + re.sub(r"([/_])(?=\w)", r"\1<wbr>", m.group(1)) + "<", cell)


@register.simple_tag
def labelled_cell(item: SafeString, headers: list[dict], index: int) -> SafeString:
    """`item` (a `<td ...>` or `<th ...>` cell as the admin renders it, already escaped) with its text
    breakable and its column's name as `data-label`; the action checkbox's column has no name to give."""
    if item[:3] not in ("<td", "<th"):
        return item
    cell = _breakable(item)
    header = headers[index] if index < len(headers) else None
    label = "" if header is None else strip_tags(str(header["text"])).strip()
    if not label or "action-checkbox" in str(header.get("class_attrib", "")):  # type: ignore[union-attr]
        return mark_safe(cell)  # noqa: S308 - the admin's escaped cell, with <wbr> between its characters
    label = label[:1].upper() + label[1:]
    return mark_safe(cell[:3] + format_html(' data-label="{}"', label) + cell[3:])  # noqa: S308
