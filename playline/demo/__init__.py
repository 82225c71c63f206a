"""The demo play and its catalog, run by ``playline demo`` against the local provider server."""
