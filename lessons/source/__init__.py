"""The cells of each lesson, one module per notebook (lessons/build.py writes them)."""
