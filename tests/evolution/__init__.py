"""One play, ``t_evolving``, in three versions: as recorded, changed safely, changed unsafely.

Each module declares the same workflow type, so import only the one a worker or
a replay should run (or pass its class explicitly: ``PlaylinePlugin(plays=[...])``).
"""
