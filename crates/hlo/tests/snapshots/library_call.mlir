module @library_call {
  func.func public @main(%arg0: tensor<2x16x4x8xbf16>, %arg1: tensor<2x16x2x8xbf16>, %arg2: tensor<2xi32>) -> (tensor<2x4x16x8xbf16>) {
    %3:2 = stablehlo.custom_call @__cudnn$fmhaSoftmax(%arg0, %arg1, %arg1, %arg2, %arg2) {api_version = 2 : i32, backend_config = "{\"cudnn_fmha_backend_config\":{\"mask_type\":\"PADDING_CAUSAL\",\"path\":\"a\\b\"}}", operand_layouts = [dense<[3, 2, 1, 0]> : tensor<4xindex>, dense<[3, 2, 1, 0]> : tensor<4xindex>, dense<[3, 2, 1, 0]> : tensor<4xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[3, 1, 2, 0]> : tensor<4xindex>, dense<0> : tensor<1xindex>]} : (tensor<2x16x4x8xbf16>, tensor<2x16x2x8xbf16>, tensor<2x16x2x8xbf16>, tensor<2xi32>, tensor<2xi32>) -> (tensor<2x4x16x8xbf16>, tensor<0xui8>)
    return %3#0 : tensor<2x4x16x8xbf16>
  }
}
