// A CPU graph: the kernel calls of one forward pass, recorded while it runs
// eagerly and replayed later from C++ alone. The CPU's counterpart of a CUDA
// graph: a batch-1 decode step of a small model spends more time in the
// Python that issues its ~300 kernel calls than in some of the kernels,
// and a replay issues them with none of it.
//
// Every kernel entry point of this extension runs through `run_op`, which
// runs the call and, while a graph is being captured on this thread, keeps
// it: its tensors held by value (so the buffers outlive the capture and are
// written again at each replay) and its scalars as they were. Whatever reads
// its inputs from a tensor's contents (positions, slots, block tables,
// lengths) reads the new contents at each replay; whatever was decided from
// shapes or host values at capture is frozen, as in a CUDA graph. Calls the
// graph cannot see (torch ops issued from Python) are not replayed: the
// runner that captures checks a replay against an eager run before it uses
// the graph (runtime/worker/decode_graph.py).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace pagoda_cpu {

class CpuGraph {
 public:
  // Record this thread's kernel calls into this graph (it must be empty and
  // no other capture may be running on the thread).
  void begin_capture();
  void end_capture();
  // Run every recorded call again, in order.
  void replay() const;
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size()); }
  void add(std::function<void()> node) { nodes_.push_back(std::move(node)); }
  // The graph this thread is capturing into, or nullptr.
  static CpuGraph* capturing();

 private:
  std::vector<std::function<void()>> nodes_;
};

// Runs `op` now and, while this thread captures a graph, records it there.
template <typename Op>
void run_op(Op op) {
  op();
  if (CpuGraph* graph = CpuGraph::capturing()) graph->add(std::move(op));
}

}  // namespace pagoda_cpu
