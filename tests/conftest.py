pytest_plugins = ["ddp_devcluster.pytest_plugin"]
