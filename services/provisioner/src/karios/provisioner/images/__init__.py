"""The OS image catalog (issue 25 item 2): registration — download with the checksum, qcow2/raw
converted once to raw.zst, compressed sources checked end to end — and the catalog's records."""
