"""PostgreSQL: the committer (one statement of data-modifying CTEs per plan), the network
bounds and the connection pool of a worker, LISTEN/NOTIFY, and the application role that
cannot undo the audit log's protection.
"""
