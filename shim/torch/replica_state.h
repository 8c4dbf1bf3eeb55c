// Online SDC mode (OPGUARD_SDC, docs/torch.md "Online SDC mode"): no op is
// observed; after each optimizer step the package records the replica state,
// each parameter with its optimizer state, through the dispatcher op
// registered here, and `opguard ranks --replicas` compares it across
// data-parallel replicas.
#pragma once

namespace opguard::torch_adapter {

// Defines opguard::replica_state(str[] names, Tensor[] state, int[] counts)
// -> int: records one replicated op per name, named names[i], without
// inputs, whose outputs are the next counts[i] tensors of `state`; returns how
// many were recorded.
void RegisterReplicaStateOp();

}  // namespace opguard::torch_adapter
