"""What a PromQL expression names: its metrics with the labels each selector matches on, the labels it
groups or joins by, and the functions it calls. Enough of the language for the expressions of
deploy/ (promtool parses them for real: tests/ops/test_prometheus_rules.py); anything it does not
recognise is reported as a metric name, so an unknown word fails the check rather than passing it."""

import re
from dataclasses import dataclass, field

STRING = r'"(?:[^"\\]|\\.)*"'
SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^{}]*)\}")
MATCHER = re.compile(rf"([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*({STRING})")
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
RANGE = re.compile(r"\[[^\]]*\]")
NUMBER = re.compile(r"(?<![\w:])\d+(?:\.\d+)?(?:e[+-]?\d+)?(?![\w:])", re.IGNORECASE)
WORD = re.compile(r"[A-Za-z_:][\w:]*")
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})
FUNCTIONS = frozenset(
    {
        "sum", "min", "max", "avg", "count", "topk", "bottomk", "quantile", "stddev", "stdvar", "group",
        "count_values", "rate", "irate", "increase", "delta", "deriv", "histogram_quantile", "vector",
        "scalar", "clamp_min", "clamp_max", "abs", "round", "ceil", "floor", "absent", "absent_over_time",
        "max_over_time", "min_over_time", "avg_over_time", "sum_over_time", "last_over_time", "time",
        "timestamp", "label_replace", "label_join", "sort", "sort_desc", "changes", "resets",
    }
)  # fmt: skip


@dataclass
class Names:
    metrics: dict[str, set[str]] = field(default_factory=dict)  # metric -> labels its selectors match
    values: dict[str, set[str]] = field(default_factory=dict)  # label -> values matched with = or !=
    grouping: set[str] = field(default_factory=set)  # by/without/on/ignoring/group_* labels
    functions: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)  # a word followed by `(` that is no known function


def names(expr: str) -> Names:
    found = Names()

    def selector(match: re.Match) -> str:
        metric, body = match.group(1), match.group(2)
        labels = set()
        for m in MATCHER.finditer(body):
            labels.add(m.group(1))
            if m.group(2) in ("=", "!="):
                found.values.setdefault(m.group(1), set()).add(m.group(3)[1:-1])
        if MATCHER.sub("", body).replace(",", "").strip():
            raise ValueError(f"unreadable matchers in {match.group(0)!r}")
        if metric:
            found.metrics.setdefault(metric, set()).update(labels)
            return f" {metric} "
        return " "

    def grouping(match: re.Match) -> str:
        found.grouping.update(label.strip() for label in match.group(2).split(",") if label.strip())
        return " "

    text = SELECTOR.sub(selector, expr)
    text = GROUPING.sub(grouping, text)
    text = NUMBER.sub(" ", RANGE.sub(" ", text))
    for word in WORD.finditer(text):
        name, rest = word.group(0), text[word.end() :].lstrip()
        if name in KEYWORDS:
            continue
        if rest.startswith("("):
            (found.functions if name in FUNCTIONS else found.unknown).add(name)
        else:
            found.metrics.setdefault(name, set())
    return found
