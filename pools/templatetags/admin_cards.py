"""Every changelist of the admin reads as labelled cards on a phone (issue 47 point 7): each cell of a
result row carries its column's name (`data-label`), which pools/static/pools/admin.css writes before the
value when the table stacks. Used by templates/admin/change_list_results.html, for every ModelAdmin."""

from django import template
from django.utils.html import format_html, strip_tags
from django.utils.safestring import SafeString, mark_safe

register = template.Library()


@register.simple_tag
def labelled_cell(item: SafeString, headers: list[dict], index: int) -> SafeString:
    """`item` (a `<td ...>` or `<th ...>` cell as the admin renders it) with its column's name as
    `data-label`; the action checkbox's column has no name to give."""
    header = headers[index] if index < len(headers) else None
    if header is None or "action-checkbox" in str(header.get("class_attrib", "")):
        return item
    label = strip_tags(str(header["text"])).strip()
    if not label or item[:3] not in ("<td", "<th"):
        return item
    return mark_safe(item[:3] + format_html(' data-label="{}"', label[:1].upper() + label[1:]) + item[3:])  # noqa: S308
