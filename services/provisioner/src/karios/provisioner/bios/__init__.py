"""BIOS settings with intent (issue 27 item 4).

``intents.py`` pure: named intents (``virtualization``, ``iommu``, ``sriov``, ``uefi_boot``,
``pxe_on_nic``) → per-vendor BIOS attributes (the one table, each row with its evidence), the plan
(only the attributes whose current value differs) and the read-back verdict. ``apply.py`` the
Redfish adapter (read ``Bios``, PATCH its settings object with the vendor's apply time, read back).
``step.py`` the provisioning job's use of both: before the job's one reset, after it.
"""
