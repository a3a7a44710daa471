"""Course support: the adapter graders load solutions through, the communicator students program
against. simpar's reference solutions are not part of the package: they live in ``instructor/``
of the repository, for its tests and for teachers. The assignments live in
``assignments/`` at the top of the repository."""
