module @all_ops {
  func.func public @main(%arg0: tensor<4x8xf32>, %arg1: tensor<8x6xf32>, %arg2: tensor<2x3xi32>) -> (tensor<4x4xbf16>, tensor<2x3x8xf32>, tensor<4xf32>, tensor<2x2x2xf32>) {
    %3 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : (tensor<4x8xf32>, tensor<8x6xf32>) -> tensor<4x6xf32>
    %4 = stablehlo.add %3, %3 : tensor<4x6xf32>
    %5 = stablehlo.subtract %4, %3 : tensor<4x6xf32>
    %6 = stablehlo.multiply %5, %3 : tensor<4x6xf32>
    %7 = stablehlo.divide %6, %4 : tensor<4x6xf32>
    %8 = stablehlo.maximum %7, %3 : tensor<4x6xf32>
    %9 = stablehlo.minimum %8, %3 : tensor<4x6xf32>
    %10 = stablehlo.negate %9 : tensor<4x6xf32>
    %11 = stablehlo.exponential %10 : tensor<4x6xf32>
    %12 = stablehlo.log %11 : tensor<4x6xf32>
    %13 = stablehlo.logistic %12 : tensor<4x6xf32>
    %14 = stablehlo.tanh %13 : tensor<4x6xf32>
    %15 = stablehlo.rsqrt %11 : tensor<4x6xf32>
    %16 = stablehlo.sqrt %11 : tensor<4x6xf32>
    %17 = stablehlo.power %16, %15 : tensor<4x6xf32>
    %18 = stablehlo.constant dense<0x00000000> : tensor<f32>
    %19 = stablehlo.reduce(%17 init: %18) across dimensions = [1] : (tensor<4x6xf32>, tensor<f32>) -> tensor<4xf32>
     reducer(%r0_a: tensor<f32>, %r0_b: tensor<f32>)  {
      %r0_c = stablehlo.add %r0_a, %r0_b : tensor<f32>
      stablehlo.return %r0_c : tensor<f32>
    }
    %20 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %21 = stablehlo.reduce(%14 init: %20) across dimensions = [0] : (tensor<4x6xf32>, tensor<f32>) -> tensor<6xf32>
     reducer(%r1_a: tensor<f32>, %r1_b: tensor<f32>)  {
      %r1_c = stablehlo.maximum %r1_a, %r1_b : tensor<f32>
      stablehlo.return %r1_c : tensor<f32>
    }
    %22 = stablehlo.broadcast_in_dim %19, dims = [0] : (tensor<4xf32>) -> tensor<4x6xf32>
    %23 = stablehlo.broadcast_in_dim %21, dims = [1] : (tensor<6xf32>) -> tensor<4x6xf32>
    %24 = stablehlo.compare  LT, %22, %23,  FLOAT : (tensor<4x6xf32>, tensor<4x6xf32>) -> tensor<4x6xi1>
    %25 = stablehlo.select %24, %22, %23 : tensor<4x6xi1>, tensor<4x6xf32>
    %26 = stablehlo.transpose %25, dims = [1, 0] : (tensor<4x6xf32>) -> tensor<6x4xf32>
    %27 = stablehlo.reshape %26 : (tensor<6x4xf32>) -> tensor<3x8xf32>
    %28 = stablehlo.slice %27 [0:2, 1:8:2] : (tensor<3x8xf32>) -> tensor<2x4xf32>
    %29 = stablehlo.concatenate %28, %28, dim = 0 : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
    %30 = stablehlo.iota dim = 1 : tensor<4x4xi32>
    %31 = stablehlo.convert %30 : (tensor<4x4xi32>) -> tensor<4x4xf32>
    %32 = stablehlo.add %29, %31 : tensor<4x4xf32>
    %33 = stablehlo.convert %32 : (tensor<4x4xf32>) -> tensor<4x4xbf16>
    %34 = "stablehlo.gather"(%arg0, %arg2) <{dimension_numbers = #stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<4x8xf32>, tensor<2x3xi32>) -> tensor<2x3x8xf32>
    %35 = stablehlo.constant dense<"0x0000803F000020C00000000000004040"> : tensor<4xf32>
    %36 = stablehlo.constant dense<0x3F000000> : tensor<2x3x8xf32>
    %37 = stablehlo.multiply %34, %36 : tensor<2x3x8xf32>
    %38 = stablehlo.reshape %arg0 : (tensor<4x8xf32>) -> tensor<2x2x8xf32>
    %39 = stablehlo.reshape %arg0 : (tensor<4x8xf32>) -> tensor<2x8x2xf32>
    %40 = stablehlo.dot_general %38, %39, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [HIGHEST, HIGHEST] : (tensor<2x2x8xf32>, tensor<2x8x2xf32>) -> tensor<2x2x2xf32>
    return %33, %37, %35, %40 : tensor<4x4xbf16>, tensor<2x3x8xf32>, tensor<4xf32>, tensor<2x2x2xf32>
  }
}
