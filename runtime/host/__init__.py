"""Facts about this machine: private files and network file systems (``files``), processes
by pid for same-host takeover (``pids``), and CPUs for a worker (``cpu``).
"""
