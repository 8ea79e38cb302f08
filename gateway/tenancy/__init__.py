"""Tenants at run time: hashed keys, the admin-edited tenants in SQLite, live reload, budgets.

`gateway.tenants` holds the types and the file parser; this package keeps the running
`TenantsConfig` current (`registry`), stores admin edits, keys, the audit log and spend
(`store`), enforces token budgets (`ledger`) and serves `/admin/tenants` (`admin`).
"""
