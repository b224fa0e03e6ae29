pytest_plugins = ["tests.fakes.fixtures"]
