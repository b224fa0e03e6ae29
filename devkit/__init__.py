"""The gateway's development kit: fake upstreams that speak the providers' real wire formats, used by the
test suite, by `make run`'s demo and by the soak and bench harnesses. Not imported by the gateway itself.

The test suite's fake provider is `upstream.FakeUpstream` (OpenAI and Anthropic), built from `server` (the
loopback server, scripting and recording), `files_api` (OpenAI's Files API), `wire` (each API's bodies and
events) and `behaviours` (what a scripted request gets, and the providers' error shapes); `azure`,
`bedrock` and `gemini` are the other providers' fakes on the same machinery.
"""
