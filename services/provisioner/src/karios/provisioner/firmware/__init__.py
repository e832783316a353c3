"""Firmware updates through the BMC (issue 27 item 5): core.py (pure rules: plan, task states,
per-component results), bmc.py (the Redfish reads and the push), store.py (SQL), service.py
(the use cases and their bus wiring)."""
