"""The format: the contract every other layer stands on, importing nothing of fa4trace.

``layout`` is the trace buffer's binary layout (shared by the device recorder and the host
decoder), ``vocab`` the event vocabulary, ``errors`` the errors a user can meet.
"""
