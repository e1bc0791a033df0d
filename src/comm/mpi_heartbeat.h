/* Liveness of the mpi backend's ranks (mpi_heartbeat.c): each rank's
 * heartbeat thread sends beats to every other rank over a communicator of
 * its own and counts the beats it receives; a waiting rank (comm_mpi.c)
 * reads the counts. */
#ifndef TP_MPI_HEARTBEAT_H
#define TP_MPI_HEARTBEAT_H

#include "tensorpar/base.h"

#include <mpi.h>
#include <stdint.h>

typedef struct tp_mpi_beat tp_mpi_beat;

/* Starts the thread on a duplicate of `world` (which needs
 * MPI_THREAD_MULTIPLE: the thread calls MPI while the rank's own thread
 * does).  Collective over `world`. */
tp_status tp_mpi_beat_start(MPI_Comm world, tp_mpi_beat **out);
/* Stops the thread.  `farewell`: tell the others that this rank leaves on
 * purpose (its silence from now on is no hang) and free the communicator;
 * without it (after a failure, when a peer may never take part again)
 * nothing that could wait for a peer is done. */
void tp_mpi_beat_stop(tp_mpi_beat *b, int farewell);
/* Beats received from world rank r so far; UINT64_MAX once r has said
 * farewell. */
uint64_t tp_mpi_beat_heard(const tp_mpi_beat *b, int r);

#endif
