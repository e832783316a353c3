"""Out-of-band inspection (issue 27 item 1): a server's hardware as its BMC reports it.

``parse.py`` pure (Redfish JSON → contract models), ``collect.py`` the Redfish reads through the
driver (links followed, gaps named), ``store.py`` SQL (``provision.hardware_records``),
``service.py`` the use cases and their bus wiring. Vendor differences: the driver's
:class:`~karios.provisioner.drivers.quirks.Quirks` (documented in ``quirks.QUIRKS``).
"""
