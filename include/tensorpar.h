/* tensorpar.h — the whole public API in one include.
 *
 * A C program that uses the library includes this header (or only the
 * subsystem headers it needs) and links libtensorpar.  The subsystems, from
 * the ground up:
 *   base      status codes and errors, logging, dtypes, tensors, thread pool
 *   kernels   matmul, attention, norms, rope; the ISA choice
 *   io        safetensors checkpoints, config.json, presets' architectures
 *   comm      process groups and collectives (shm, mpi, self), the launcher
 *   dist      device meshes, placements, DTensors, redistribute
 *   parallel  tensor-parallel styles, the style registry, plans
 *   models    loading a model (sharded on read) and its forward pass
 *   text      tokenizer, sampling, generation, chat templates
 *   train     optimizers, learning-rate schedules, gradient clipping, training data
 *   api       DistributedConfig, ParallelismConfig, tp_model_from_pretrained
 */
#ifndef TENSORPAR_H
#define TENSORPAR_H

#include "tensorpar/base.h"
#include "tensorpar/settings.h"
#include "tensorpar/kernels.h"
#include "tensorpar/io.h"
#include "tensorpar/comm.h"
#include "tensorpar/dist.h"
#include "tensorpar/parallel.h"
#include "tensorpar/models.h"
#include "tensorpar/module.h"
#include "tensorpar/text.h"
#include "tensorpar/train.h"
#include "tensorpar/api.h"

#endif
