// MsAtbPagedAttention, host side: op definition, shape and dtype inference, tiling (ms_atb_plan.h).
//   query [T, H, D]; key_cache, value_cache [NB, BS, KVH, D]; block_tables [B, MAXB] int32;
//   context_lens [B] int32; query_start_loc [B + 1] int32; scale [1] float32; key_scale_cache,
//   value_scale_cache [NB, BS, KVH] float32 (optional: int8 caches) -> out [T, H, D].
// Tiling keys: 0 float16, 1 bfloat16, + 2 with int8 caches (vector cores); a launch with the Cube (plan.cube)
// takes key + 4: a mixed kernel (KERNEL_TYPE_MIX_AIC_1_2) whose block_dim counts AI
// core groups of one AIC and two AIVs.
#include "ms_atb_hardware.h"
#include "ms_atb_paged_attention_tiling.h"
#include "register/op_def_registry.h"

namespace optiling {
static ge::graphStatus MsAtbPagedAttentionTiling(gert::TilingContext *context) {
  const gert::Shape &q = context->GetInputShape(0)->GetStorageShape();       // [T, H, D]
  const gert::Shape &cache = context->GetInputShape(1)->GetStorageShape();   // [NB, BS, KVH, D]
  const gert::Shape &tables = context->GetInputShape(3)->GetStorageShape();  // [B, MAXB]
  const bool quant = context->GetInputDesc(1)->GetDataType() == ge::DT_INT8;
  const ms_atb_plan::PagedAttentionShape shape{q.GetDim(0), q.GetDim(1), cache.GetDim(2), q.GetDim(2), cache.GetDim(1),
                                               cache.GetDim(0), tables.GetDim(0), tables.GetDim(1), 2, quant ? 1 : 2};
  const char *why = "";
  const ms_atb_plan::PagedAttentionPlan plan =
      ms_atb_plan::PlanPagedAttention(shape, ms_atb_plan::PlatformFigures(context), &why);
  if (plan.ub_bytes == 0) return ge::GRAPH_FAILED;
  MsAtbPagedAttentionTilingData tiling;
  ms_atb_plan::StorePagedAttention(shape, plan, tiling);
  context->SetBlockDim(plan.block_dim);
  context->SetTilingKey((context->GetInputDesc(0)->GetDataType() == ge::DT_BF16 ? 1 : 0) + (quant ? 2 : 0) +
                        (plan.cube ? 4 : 0));
  tiling.SaveToBuffer(context->GetRawTilingData()->GetData(), context->GetRawTilingData()->GetCapacity());
  context->GetRawTilingData()->SetDataSize(tiling.GetDataSize());
  size_t *workspace = context->GetWorkspaceSizes(1);
  // The runtime's own part, then ours: each group's Cube <-> vector exchange and the context parts' partials.
  workspace[0] = ms_atb_plan::SystemWorkspace(context) + plan.workspace_bytes;
  return ge::GRAPH_SUCCESS;
}
}  // namespace optiling

namespace ge {
static graphStatus MsAtbPagedAttentionInferShape(gert::InferShapeContext *context) {
  *context->GetOutputShape(0) = *context->GetInputShape(0);  // out [T, H, D] = query's shape
  return GRAPH_SUCCESS;
}

static graphStatus MsAtbPagedAttentionInferDataType(gert::InferDataTypeContext *context) {
  context->SetOutputDataType(0, context->GetInputDataType(0));
  return GRAPH_SUCCESS;
}
}  // namespace ge

namespace ops {
class MsAtbPagedAttention : public OpDef {
 public:
  explicit MsAtbPagedAttention(const char *name) : OpDef(name) {
    // One column per tiling key: queries float16 / bfloat16, caches of the same type or int8.
    const std::vector<ge::DataType> rows{ge::DT_FLOAT16, ge::DT_BF16, ge::DT_FLOAT16, ge::DT_BF16};
    const std::vector<ge::DataType> caches{ge::DT_FLOAT16, ge::DT_BF16, ge::DT_INT8, ge::DT_INT8};
    const std::vector<ge::DataType> ints(4, ge::DT_INT32), floats(4, ge::DT_FLOAT);
    const std::vector<ge::Format> nd(4, ge::FORMAT_ND);
    this->Input("query").ParamType(REQUIRED).DataType(rows).Format(nd);
    this->Input("key_cache").ParamType(REQUIRED).DataType(caches).Format(nd);
    this->Input("value_cache").ParamType(REQUIRED).DataType(caches).Format(nd);
    this->Input("block_tables").ParamType(REQUIRED).DataType(ints).Format(nd);
    this->Input("context_lens").ParamType(REQUIRED).DataType(ints).Format(nd);
    this->Input("query_start_loc").ParamType(REQUIRED).DataType(ints).Format(nd);
    this->Input("scale").ParamType(REQUIRED).DataType(floats).Format(nd);
    this->Input("key_scale_cache").ParamType(OPTIONAL).DataType(floats).Format(nd);
    this->Input("value_scale_cache").ParamType(OPTIONAL).DataType(floats).Format(nd);
    this->Output("out").ParamType(REQUIRED).DataType(rows).Format(nd);
    this->SetInferShape(ge::MsAtbPagedAttentionInferShape).SetInferDataType(ge::MsAtbPagedAttentionInferDataType);
    this->AICore().SetTiling(optiling::MsAtbPagedAttentionTiling);
    this->AICore().AddConfig("ascend910b");
  }
};
OP_ADD(MsAtbPagedAttention);
}  // namespace ops
