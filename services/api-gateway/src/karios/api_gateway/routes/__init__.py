"""HTTP routes of the gateway, one module per area of the seed API."""
