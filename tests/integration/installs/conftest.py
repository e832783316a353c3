from tests.fixtures.installs import install_stack, installer_endpoint, live_images, live_root  # noqa: F401  (fixtures)
