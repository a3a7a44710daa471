"""Teachers' material, kept out of the installed package: ``pip install simpar`` ships the
assignments' stubs and graders, never these answers."""
