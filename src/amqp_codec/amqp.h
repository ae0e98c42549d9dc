/* amqp.h - rebound's AMQP 0-9-1 codec: pure C, no I/O, no allocation.
 *
 *   amqp_status.h  status codes and their AMQP reply codes
 *   amqp_wire.h    byte views, big-endian readers and writers
 *   amqp_frame.h   protocol header, frame parsing and writing
 *   amqp_method.h  every method of every class, from one descriptor table
 *   amqp_table.h   field tables and arrays
 *   amqp_props.h   content headers and basic properties
 */
#ifndef AMQP_H
#define AMQP_H

#include "amqp_frame.h"
#include "amqp_method.h"
#include "amqp_props.h"
#include "amqp_status.h"
#include "amqp_table.h"
#include "amqp_wire.h"

#endif
