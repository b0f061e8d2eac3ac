// The register of point-to-point message tags: which subsystem sends on which
// communicator, with which tags.
//
// MPI (and the in-process backend) match a receive to a message by (communicator,
// source, tag) in posting order. ProcessGroups gives group kinds with the same members
// one communicator (dp and dp-cp when cp = 1; any kind spanning every dim of size > 1 is
// the world), so two subsystems on "different" groups may share a message space. The
// rule that keeps them apart:
//
//  1. A subsystem that sends point-to-point messages does so on its own duplicate of its
//     group (Communicator::dup, made when the subsystem is built, collectively): the
//     pipeline executor (pp group), ring attention (cp group), every AllReducer of a
//     point-to-point algorithm (its group). Its messages cannot match anybody else's,
//     whatever the tags, and a rank that uses one subsystem more often than its peers use
//     another cannot shift the other's matching.
//  2. Inside one subsystem the tags below tell its messages apart. A sequence that numbers
//     messages (the all-reduces in flight) is counted per communicator: a process-wide
//     counter would differ between ranks that run different numbers of all-reduces on
//     other groups.
//  3. The only point-to-point traffic on a communicator that is not a subsystem's own is
//     the runtime's gathers to rank 0 on the world (kTraceGather, kCheckpointParts), made
//     one at a time between steps, when nothing else is in flight.
//
// Every tag is below 32768, the bound MPI guarantees (MPI_TAG_UB >= 32767).
#pragma once

namespace ndmesh::comm::tags {

/// Pipeline executor (parallel/pp/executor.cpp): activations in [0, kPipelineGradientFirst),
/// gradients in [kPipelineGradientFirst, 2 * kPipelineGradientFirst), each numbered by
/// (receiving virtual stage, micro-batch) modulo kPipelineGradientFirst.
inline constexpr int kPipelineGradientFirst = 16384;

/// Ring attention (parallel/cp/ring_attention.cpp): the [k | v] block in hand, its
/// positions, and the travelling dK/dV accumulator.
inline constexpr int kRingKv = 131;
inline constexpr int kRingPositions = 132;
inline constexpr int kRingDkv = 133;

/// All-reduce algorithms (comm/allreduce.cpp): AllReducerOptions::tag (default
/// kAllReduceFirst) plus the reducer's sequence number modulo kAllReduceSequences.
inline constexpr int kAllReduceFirst = 7700;
inline constexpr int kAllReduceSequences = 4096;

/// The ring reduce-scatter (comm/allreduce.hpp ring_reduce_scatter), on the Gloo
/// backend's own duplicate of the group it reduces over, one at a time.
inline constexpr int kReduceScatter = 7699;

/// The runtime on the world: the pipeline trace events gathered to rank 0
/// (parallel/pp/trace.cpp), and the checkpoint manifest parts sent to rank 0 when saving
/// (parallel/checkpoint_io.cpp).
inline constexpr int kTraceGather = 77;
inline constexpr int kCheckpointParts = 78;

}  // namespace ndmesh::comm::tags
