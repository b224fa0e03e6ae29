"""The upstream providers, one module each (PURE): see `base.Provider` and `registry.PROVIDERS`."""
