"""proxy/wire/apis/chat.py: the OpenAI-shaped client APIs' turn requirements (pure)."""

from proxy.wire.apis.chat import turn_requirements
from proxy.wire.translations.token_estimate import IMAGE_TOKENS


def test_turn_requirements_see_tools_tool_results_images_and_limits_at_any_depth():
    deep: dict = {"type": "image_url", "image_url": {"url": "data:,"}}
    for _ in range(2000):  # deeper than the interpreter's recursion limit
        deep = {"content": [deep]}
    body = {
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}, deep],
        "max_tokens": 77,
    }
    r = turn_requirements(body, body_size=400)
    assert (r.tools_offered, r.untrusted_content, r.vision) == (True, True, True)
    # The image part (its strings: 15 characters) counts its documented cost; the rest four bytes a token.
    assert (r.prompt_tokens, r.max_output_tokens) == ((400 - 15) // 4 + IMAGE_TOKENS, 77)
