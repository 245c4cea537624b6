"""Print the table of shipped diffusers families (the README's and docs' "Supported diffusers models")."""

from . import markdown_table

print(markdown_table())
