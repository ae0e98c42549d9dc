/* test_common.h - includes every cmocka test needs. */
#ifndef TEST_COMMON_H
#define TEST_COMMON_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "amqp.h"
#include "hexfile.h"

#define BYTES(lit) ((amqp_bytes){(const uint8_t *)(lit), sizeof(lit) - 1})

#endif
