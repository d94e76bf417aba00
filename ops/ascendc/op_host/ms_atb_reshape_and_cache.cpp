// MsAtbReshapeAndCache, host side: op definition, shape and dtype inference, tiling (ms_atb_plan.h).
//   key, value [T, KVH, D]; key_cache, value_cache [NB, BS, KVH, D] (written in place);
//   slot_mapping [T] int32; key_scale_cache, value_scale_cache [NB, BS, KVH] float32 (optional: int8 caches)
//   -> done [1] int32. Tiling keys: 0 float16, 1 bfloat16, + 2 with int8 caches.
#include "ms_atb_hardware.h"
#include "ms_atb_reshape_and_cache_tiling.h"
#include "register/op_def_registry.h"

namespace optiling {
static ge::graphStatus MsAtbReshapeAndCacheTiling(gert::TilingContext *context) {
  const gert::Shape &key = context->GetInputShape(0)->GetStorageShape();    // [T, KVH, D]
  const gert::Shape &cache = context->GetInputShape(2)->GetStorageShape();  // [NB, BS, KVH, D]
  const bool quant = context->GetInputDesc(2)->GetDataType() == ge::DT_INT8;
  const ms_atb_plan::ReshapeAndCacheShape shape{key.GetDim(0), key.GetDim(1), key.GetDim(2), cache.GetDim(0),
                                                cache.GetDim(1), 2, quant ? 1 : 2};
  const char *why = "";
  const ms_atb_plan::ReshapeAndCachePlan plan =
      ms_atb_plan::PlanReshapeAndCache(shape, ms_atb_plan::PlatformFigures(context), &why);
  if (plan.ub_bytes == 0) return ge::GRAPH_FAILED;
  MsAtbReshapeAndCacheTilingData tiling;
  ms_atb_plan::StoreReshapeAndCache(shape, plan, tiling);
  context->SetBlockDim(plan.block_dim);
  context->SetTilingKey((context->GetInputDesc(0)->GetDataType() == ge::DT_BF16 ? 1 : 0) + (quant ? 2 : 0));
  tiling.SaveToBuffer(context->GetRawTilingData()->GetData(), context->GetRawTilingData()->GetCapacity());
  context->GetRawTilingData()->SetDataSize(tiling.GetDataSize());
  size_t *workspace = context->GetWorkspaceSizes(1);
  workspace[0] = ms_atb_plan::SystemWorkspace(context);
  return ge::GRAPH_SUCCESS;
}
}  // namespace optiling

namespace ge {
static graphStatus MsAtbReshapeAndCacheInferShape(gert::InferShapeContext *context) {
  gert::Shape *done = context->GetOutputShape(0);  // done [1]
  done->SetDimNum(1);
  done->SetDim(0, 1);
  return GRAPH_SUCCESS;
}

static graphStatus MsAtbReshapeAndCacheInferDataType(gert::InferDataTypeContext *context) {
  context->SetOutputDataType(0, ge::DT_INT32);
  return GRAPH_SUCCESS;
}
}  // namespace ge

namespace ops {
class MsAtbReshapeAndCache : public OpDef {
 public:
  explicit MsAtbReshapeAndCache(const char *name) : OpDef(name) {
    // One column per tiling key: rows float16 / bfloat16, caches of the same type or int8.
    const std::vector<ge::DataType> rows{ge::DT_FLOAT16, ge::DT_BF16, ge::DT_FLOAT16, ge::DT_BF16};
    const std::vector<ge::DataType> caches{ge::DT_FLOAT16, ge::DT_BF16, ge::DT_INT8, ge::DT_INT8};
    const std::vector<ge::DataType> ints(4, ge::DT_INT32), floats(4, ge::DT_FLOAT);
    const std::vector<ge::Format> nd(4, ge::FORMAT_ND);
    this->Input("key").ParamType(REQUIRED).DataType(rows).Format(nd);
    this->Input("value").ParamType(REQUIRED).DataType(rows).Format(nd);
    this->Input("key_cache").ParamType(REQUIRED).DataType(caches).Format(nd);
    this->Input("value_cache").ParamType(REQUIRED).DataType(caches).Format(nd);
    this->Input("slot_mapping").ParamType(REQUIRED).DataType(ints).Format(nd);
    this->Input("key_scale_cache").ParamType(OPTIONAL).DataType(floats).Format(nd);
    this->Input("value_scale_cache").ParamType(OPTIONAL).DataType(floats).Format(nd);
    this->Output("done").ParamType(REQUIRED).DataType(ints).Format(nd);
    this->SetInferShape(ge::MsAtbReshapeAndCacheInferShape).SetInferDataType(ge::MsAtbReshapeAndCacheInferDataType);
    this->AICore().SetTiling(optiling::MsAtbReshapeAndCacheTiling);
    this->AICore().AddConfig("ascend910b");
  }
};
OP_ADD(MsAtbReshapeAndCache);
}  // namespace ops
