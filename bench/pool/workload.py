"""What `make bench-pool` simulates: the accounts, the conversations and the pace (pure).

- 23 accounts (`accounts`): 20 steady ones (16 OpenAI-shaped, 4 Anthropic-shaped) with equal limits,
  `a08` answering 503 for `outage_s` from a fifth of the phase, `a15` (Anthropic-shaped) answering 401
  for `outage_s` from half of it, and `a01` hung from start to end. Names sort in that order, so a plan
  that is a priority list meets the hung account first, as the issue's reproduction did.
- Conversations: `slots` clients, each holding one conversation of `turns` turns at a time (then a new
  one); the run joins each slot's first conversation part way (`first_turn`), so conversations begin and
  end all along it, as a pool serving many agents sees them. Each conversation opens with its own
  ~20k-token system prompt (`[conv:ID]` and the project context of an agent), so only the account that
  served its earlier turns has its prefix cached.
  Most clients name it with `x-gateway-session`; every twelfth with the Responses `prompt_cache_key`,
  with Claude Code's `x-claude-code-session-id` on `/v1/messages`, or with Codex's `session-id`.
- Pace: open loop. The slots' turns are spread evenly over time at `rate` turns per second, fixed
  before the run from the accounts' limits and the turns' token cost (`pace`): `load` (0.7) of the
  capacity of the 20 steady accounts alone, by whichever of requests and tokens per minute binds.
"""

from __future__ import annotations

from dataclasses import dataclass

from devkit.pool_upstream import ANSWER, AccountSpec, Outage, tokens_of

RPM, TPM = 120, 1_500_000
MAX_TOKENS = 256
PREFIX_CHARS = 80_000  # ~20k tokens at 4 characters a token
KINDS = (
    "gs",
    "pck",
    "cc",
    "sid",
)  # x-gateway-session, prompt_cache_key, x-claude-code-session-id, session-id
KIND_NAMES = {
    "gs": "x-gateway-session (Chat)",
    "pck": "prompt_cache_key (Responses)",
    "cc": "x-claude-code-session-id (Messages)",
    "sid": "session-id (Chat)",
}
ANTHROPIC = {"a04", "a11", "a15", "a19", "a22"}
HUNG, UNAVAILABLE, UNAUTHORIZED = "a01", "a08", "a15"

_CONTEXT = "".join(
    f"# src/module_{i:03d}.py\ndef handler_{i}(request, store):\n    return store.apply(request, step={i})\n"
    for i in range(2000)
)[: PREFIX_CHARS - 400]
_INSTRUCTIONS = (
    "You are a coding agent working in the repository below. Read before you edit, keep changes small, "
    "run the tests after every change and report what you changed and why.\n\n"
)


@dataclass(frozen=True)
class Settings:
    duration_s: float
    outage_s: float
    slots: int = 48
    turns: int = 20
    load: float = 0.7


def settings(quick: bool) -> Settings:
    return Settings(duration_s=25, outage_s=6, slots=24, turns=10) if quick else Settings(100, 20)


def accounts(s: Settings) -> list[AccountSpec]:
    outages = {
        HUNG: (Outage(0, None, "hang"),),
        UNAVAILABLE: (Outage(s.duration_s / 5, s.duration_s / 5 + s.outage_s, "unavailable"),),
        UNAUTHORIZED: (Outage(s.duration_s / 2, s.duration_s / 2 + s.outage_s, "unauthorized"),),
    }
    return [
        AccountSpec(name, "anthropic" if name in ANTHROPIC else "openai", RPM, TPM, outages.get(name, ()))
        for name in (f"a{i:02d}" for i in range(1, 24))
    ]


def steady(specs: list[AccountSpec]) -> list[AccountSpec]:
    return [s for s in specs if not s.outages]


def heals(specs: list[AccountSpec]) -> dict[str, float]:
    """Each account that fails and heals: the second its outage ends."""
    return {s.name: o.end_s for s in specs for o in s.outages if o.end_s is not None and o.kind != "hang"}


def first_turn(slot: int, s: Settings) -> int:
    """The turn at which slot `slot` joins its first conversation: spread over 1..turns across the slots,
    so the steady state (conversations beginning and ending all the time) starts with the run."""
    return 1 + (slot * s.turns) // s.slots


def kind_of(slot: int) -> str:
    return {0: "pck", 3: "sid", 6: "cc"}.get(slot % 12, "gs")


def system_prompt(conversation: str) -> str:
    return f"[conv:{conversation}] " + _INSTRUCTIONS + _CONTEXT


def user_turn(turn: int) -> str:
    return f"Turn {turn}: " + "Apply the next step of the plan to the handler named in the failing test. " * 8


def history(turn: int) -> list[dict[str, str]]:
    """The messages after the system prompt for turn `turn` (1-based): every earlier turn and its
    answer, then this turn."""
    messages: list[dict[str, str]] = []
    for n in range(1, turn):
        messages += [{"role": "user", "content": user_turn(n)}, {"role": "assistant", "content": ANSWER}]
    return [*messages, {"role": "user", "content": user_turn(turn)}]


def turn_cost(s: Settings) -> float:
    """Tokens a turn costs on an OpenAI account's TPM (prompt + max_tokens), averaged over a conversation."""
    system = {"role": "system", "content": system_prompt("gs-00-000")}
    costs = [
        tokens_of(system) + sum(tokens_of(m) for m in history(t)) + MAX_TOKENS for t in range(1, s.turns + 1)
    ]
    return sum(costs) / len(costs)


@dataclass(frozen=True)
class Pace:
    rate: float  # turns per second, all slots together
    capacity_rps: float  # of the steady accounts, by requests per minute
    capacity_tps: float  # and by tokens per minute
    turn_tokens: float

    @property
    def share_of_requests(self) -> float:
        return self.rate / self.capacity_rps

    @property
    def share_of_tokens(self) -> float:
        return self.rate * self.turn_tokens / self.capacity_tps


def pace(s: Settings, specs: list[AccountSpec]) -> Pace:
    ready = steady(specs)
    rps = sum(a.rpm for a in ready) / 60
    tps = sum(a.tpm for a in ready) / 60
    cost = turn_cost(s)
    return Pace(s.load * min(rps, tps / cost), rps, tps, cost)
