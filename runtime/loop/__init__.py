"""The loop (design §5): a run executed step by step while this process holds its lease, and
the entry points that start, resume and cancel runs (``control``).
"""
