"""Course support: the adapter graders load solutions through, the communicator students program
against, and simpar's reference solutions (``simpar.course.solutions``). The assignments live in
``assignments/`` at the top of the repository."""
