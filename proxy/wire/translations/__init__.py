"""Bridges between two client APIs, one module per direction (PURE): a provider's `call` uses them when the
client speaks another API than the upstream; `translate` holds the contract every direction keeps."""
