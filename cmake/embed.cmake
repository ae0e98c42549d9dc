# Turn the file IN into a C source OUT defining px_admin_page (its bytes,
# NUL-terminated) and px_admin_page_len.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE ${OUT} "/* generated from ${IN} */\n#include <stddef.h>\n"
  "const unsigned char px_admin_page[] = {${bytes} 0};\n"
  "const size_t px_admin_page_len = ${len};\n")
