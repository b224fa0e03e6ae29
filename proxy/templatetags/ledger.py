from django import template

from proxy.ledger_admin import timeline

register = template.Library()


@register.simple_tag
def attempt_timeline(inline_admin_formset):
    """The bars of a request page's attempts (`proxy.ledger_admin.timeline`), from the inline's own
    (scoped) queryset: the forms' instances, already loaded."""
    return timeline([form.instance for form in inline_admin_formset.formset.forms])
