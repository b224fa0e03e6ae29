"""The gateway's development kit: fake upstreams that speak the providers' real wire formats, used by the
test suite, by `make run`'s demo and by the soak and bench harnesses. Not imported by the gateway itself."""
