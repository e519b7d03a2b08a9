"""Operators' decisions on approvals (design §8): the rules of deciding (``rules``), the
decisions themselves (``decisions``) and expiry past a deadline (``expiry``).
"""
