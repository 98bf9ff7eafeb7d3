"""Command-line front end; thin: parse, call one library function, render."""
