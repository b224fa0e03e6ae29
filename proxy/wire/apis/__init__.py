"""The client APIs the gateway serves, one module each (PURE): see `base.ClientApi` and `registry`."""
