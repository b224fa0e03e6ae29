from django import template

from proxy.console.requests import timeline

register = template.Library()


@register.simple_tag
def attempt_timeline(inline_admin_formset):
    """The bars of a request page's attempts (`proxy.console.requests.timeline`), from the inline's own
    (scoped) queryset: the forms' instances, already loaded."""
    return timeline([form.instance for form in inline_admin_formset.formset.forms])
