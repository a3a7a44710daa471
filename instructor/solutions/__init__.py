"""simpar's reference solutions to the assignments (a1 ... a4): graders must pass them."""
