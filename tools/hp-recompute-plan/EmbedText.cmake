# Writes the file INPUT as a C++ raw string literal into OUTPUT.
file(READ ${INPUT} content)
file(WRITE ${OUTPUT} "R\"hpr_embedded(${content})hpr_embedded\"\n")
