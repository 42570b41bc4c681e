"""Assembly: a finished render's outputs become its files (the assembler, the HLG master, previews, the metadata JSON)."""
