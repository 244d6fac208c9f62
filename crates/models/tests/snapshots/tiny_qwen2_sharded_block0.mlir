module @siphon_forward {
  sdy.mesh @mesh = <["data"=2, "model"=2]>
  func.func public @main(%arg0: tensor<16x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}, %arg1: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}, %arg2: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>}, %arg3: tensor<4x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>}, %arg4: tensor<4x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>}, %arg5: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}]>}, %arg6: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}]>}, %arg7: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}]>}, %arg8: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}, %arg9: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}, %arg10: tensor<12x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>}, %arg11: tensor<12x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>}, %arg12: tensor<8x12xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}, %arg13: tensor<2x3xi32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}, %arg14: tensor<2x3xi32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}, %arg15: tensor<2x3xi32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}) -> (tensor<2x3x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {}]>}) {
    %16 = stablehlo.reshape %arg13 : (tensor<2x3xi32>) -> tensor<6xi32>
    %17 = "stablehlo.gather"(%arg0, %16) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<16x8xf32>, tensor<6xi32>) -> tensor<6x8xf32>
    %18 = sdy.sharding_constraint %17 <@mesh, [{"data"}, {}]> : tensor<6x8xf32>
    %19 = stablehlo.constant dense<"0x0000803F"> : tensor<1xf32>
    %20 = stablehlo.reshape %arg15 : (tensor<2x3xi32>) -> tensor<6xi32>
    %21 = stablehlo.convert %20 : (tensor<6xi32>) -> tensor<6xf32>
    %22 = stablehlo.broadcast_in_dim %21, dims = [0] : (tensor<6xf32>) -> tensor<6x1xf32>
    %23 = stablehlo.broadcast_in_dim %19, dims = [1] : (tensor<1xf32>) -> tensor<6x1xf32>
    %24 = stablehlo.multiply %22, %23 : tensor<6x1xf32>
    %25 = stablehlo.concatenate %24, %24, dim = 1 : (tensor<6x1xf32>, tensor<6x1xf32>) -> tensor<6x2xf32>
    %26 = stablehlo.cosine %25 : tensor<6x2xf32>
    %27 = stablehlo.sine %25 : tensor<6x2xf32>
    %28 = stablehlo.iota dim = 0 : tensor<3x3xi32>
    %29 = stablehlo.iota dim = 1 : tensor<3x3xi32>
    %30 = stablehlo.compare  GE, %28, %29,  SIGNED : (tensor<3x3xi32>, tensor<3x3xi32>) -> tensor<3x3xi1>
    %31 = stablehlo.broadcast_in_dim %30, dims = [1, 2] : (tensor<3x3xi1>) -> tensor<2x3x3xi1>
    %32 = stablehlo.constant dense<0> : tensor<2x3xi32>
    %33 = stablehlo.compare  NE, %arg14, %32,  SIGNED : (tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<2x3xi1>
    %34 = stablehlo.broadcast_in_dim %33, dims = [0, 2] : (tensor<2x3xi1>) -> tensor<2x3x3xi1>
    %35 = stablehlo.and %31, %34 : tensor<2x3x3xi1>
    %36 = stablehlo.multiply %18, %18 : tensor<6x8xf32>
    %37 = stablehlo.constant dense<0x00000000> : tensor<f32>
    %38 = stablehlo.reduce(%36 init: %37) across dimensions = [1] : (tensor<6x8xf32>, tensor<f32>) -> tensor<6xf32>
     reducer(%r0_a: tensor<f32>, %r0_b: tensor<f32>)  {
      %r0_c = stablehlo.add %r0_a, %r0_b : tensor<f32>
      stablehlo.return %r0_c : tensor<f32>
    }
    %39 = stablehlo.constant dense<0x41000000> : tensor<6xf32>
    %40 = stablehlo.divide %38, %39 : tensor<6xf32>
    %41 = stablehlo.constant dense<0x358637BD> : tensor<6xf32>
    %42 = stablehlo.add %40, %41 : tensor<6xf32>
    %43 = stablehlo.rsqrt %42 : tensor<6xf32>
    %44 = stablehlo.broadcast_in_dim %43, dims = [0] : (tensor<6xf32>) -> tensor<6x8xf32>
    %45 = stablehlo.multiply %18, %44 : tensor<6x8xf32>
    %46 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<8xf32>) -> tensor<6x8xf32>
    %47 = stablehlo.multiply %45, %46 : tensor<6x8xf32>
    %48 = stablehlo.dot_general %47, %arg2, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<8x8xf32>) -> tensor<6x8xf32>
    %49 = stablehlo.broadcast_in_dim %arg5, dims = [1] : (tensor<8xf32>) -> tensor<6x8xf32>
    %50 = stablehlo.add %48, %49 : tensor<6x8xf32>
    %51 = stablehlo.dot_general %47, %arg3, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<4x8xf32>) -> tensor<6x4xf32>
    %52 = stablehlo.broadcast_in_dim %arg6, dims = [1] : (tensor<4xf32>) -> tensor<6x4xf32>
    %53 = stablehlo.add %51, %52 : tensor<6x4xf32>
    %54 = stablehlo.dot_general %47, %arg4, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<4x8xf32>) -> tensor<6x4xf32>
    %55 = stablehlo.broadcast_in_dim %arg7, dims = [1] : (tensor<4xf32>) -> tensor<6x4xf32>
    %56 = stablehlo.add %54, %55 : tensor<6x4xf32>
    %57 = stablehlo.reshape %50 : (tensor<6x8xf32>) -> tensor<6x4x2xf32>
    %58 = stablehlo.reshape %53 : (tensor<6x4xf32>) -> tensor<6x2x2xf32>
    %59 = stablehlo.slice %57 [0:6, 0:4, 0:1] : (tensor<6x4x2xf32>) -> tensor<6x4x1xf32>
    %60 = stablehlo.slice %57 [0:6, 0:4, 1:2] : (tensor<6x4x2xf32>) -> tensor<6x4x1xf32>
    %61 = stablehlo.negate %60 : tensor<6x4x1xf32>
    %62 = stablehlo.concatenate %61, %59, dim = 2 : (tensor<6x4x1xf32>, tensor<6x4x1xf32>) -> tensor<6x4x2xf32>
    %63 = stablehlo.broadcast_in_dim %26, dims = [0, 2] : (tensor<6x2xf32>) -> tensor<6x4x2xf32>
    %64 = stablehlo.broadcast_in_dim %27, dims = [0, 2] : (tensor<6x2xf32>) -> tensor<6x4x2xf32>
    %65 = stablehlo.multiply %57, %63 : tensor<6x4x2xf32>
    %66 = stablehlo.multiply %62, %64 : tensor<6x4x2xf32>
    %67 = stablehlo.add %65, %66 : tensor<6x4x2xf32>
    %68 = stablehlo.slice %58 [0:6, 0:2, 0:1] : (tensor<6x2x2xf32>) -> tensor<6x2x1xf32>
    %69 = stablehlo.slice %58 [0:6, 0:2, 1:2] : (tensor<6x2x2xf32>) -> tensor<6x2x1xf32>
    %70 = stablehlo.negate %69 : tensor<6x2x1xf32>
    %71 = stablehlo.concatenate %70, %68, dim = 2 : (tensor<6x2x1xf32>, tensor<6x2x1xf32>) -> tensor<6x2x2xf32>
    %72 = stablehlo.broadcast_in_dim %26, dims = [0, 2] : (tensor<6x2xf32>) -> tensor<6x2x2xf32>
    %73 = stablehlo.broadcast_in_dim %27, dims = [0, 2] : (tensor<6x2xf32>) -> tensor<6x2x2xf32>
    %74 = stablehlo.multiply %58, %72 : tensor<6x2x2xf32>
    %75 = stablehlo.multiply %71, %73 : tensor<6x2x2xf32>
    %76 = stablehlo.add %74, %75 : tensor<6x2x2xf32>
    %77 = stablehlo.reshape %67 : (tensor<6x4x2xf32>) -> tensor<6x8xf32>
    %78 = stablehlo.reshape %76 : (tensor<6x2x2xf32>) -> tensor<6x4xf32>
    %79 = stablehlo.reshape %77 : (tensor<6x8xf32>) -> tensor<2x3x2x2x2xf32>
    %80 = stablehlo.reshape %78 : (tensor<6x4xf32>) -> tensor<2x3x2x2xf32>
    %81 = stablehlo.reshape %56 : (tensor<6x4xf32>) -> tensor<2x3x2x2xf32>
    %82 = stablehlo.dot_general %79, %80, batching_dims = [0, 2] x [0, 2], contracting_dims = [4] x [3], precision = [HIGHEST, HIGHEST] : (tensor<2x3x2x2x2xf32>, tensor<2x3x2x2xf32>) -> tensor<2x2x3x2x3xf32>
    %83 = stablehlo.constant dense<0x3F3504F3> : tensor<2x2x3x2x3xf32>
    %84 = stablehlo.multiply %82, %83 : tensor<2x2x3x2x3xf32>
    %85 = stablehlo.broadcast_in_dim %35, dims = [0, 2, 4] : (tensor<2x3x3xi1>) -> tensor<2x2x3x2x3xi1>
    %86 = stablehlo.constant dense<0xFF7FFFFF> : tensor<2x2x3x2x3xf32>
    %87 = stablehlo.select %85, %84, %86 : tensor<2x2x3x2x3xi1>, tensor<2x2x3x2x3xf32>
    %88 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %89 = stablehlo.reduce(%87 init: %88) across dimensions = [4] : (tensor<2x2x3x2x3xf32>, tensor<f32>) -> tensor<2x2x3x2xf32>
     reducer(%r1_a: tensor<f32>, %r1_b: tensor<f32>)  {
      %r1_c = stablehlo.maximum %r1_a, %r1_b : tensor<f32>
      stablehlo.return %r1_c : tensor<f32>
    }
    %90 = stablehlo.broadcast_in_dim %89, dims = [0, 1, 2, 3] : (tensor<2x2x3x2xf32>) -> tensor<2x2x3x2x3xf32>
    %91 = stablehlo.subtract %87, %90 : tensor<2x2x3x2x3xf32>
    %92 = stablehlo.exponential %91 : tensor<2x2x3x2x3xf32>
    %93 = stablehlo.constant dense<0x00000000> : tensor<f32>
    %94 = stablehlo.reduce(%92 init: %93) across dimensions = [4] : (tensor<2x2x3x2x3xf32>, tensor<f32>) -> tensor<2x2x3x2xf32>
     reducer(%r2_a: tensor<f32>, %r2_b: tensor<f32>)  {
      %r2_c = stablehlo.add %r2_a, %r2_b : tensor<f32>
      stablehlo.return %r2_c : tensor<f32>
    }
    %95 = stablehlo.broadcast_in_dim %94, dims = [0, 1, 2, 3] : (tensor<2x2x3x2xf32>) -> tensor<2x2x3x2x3xf32>
    %96 = stablehlo.divide %92, %95 : tensor<2x2x3x2x3xf32>
    %97 = stablehlo.dot_general %96, %81, batching_dims = [0, 1] x [0, 2], contracting_dims = [4] x [1], precision = [HIGHEST, HIGHEST] : (tensor<2x2x3x2x3xf32>, tensor<2x3x2x2xf32>) -> tensor<2x2x3x2x2xf32>
    %98 = stablehlo.transpose %97, dims = [0, 2, 1, 3, 4] : (tensor<2x2x3x2x2xf32>) -> tensor<2x3x2x2x2xf32>
    %99 = stablehlo.reshape %98 : (tensor<2x3x2x2x2xf32>) -> tensor<6x8xf32>
    %100 = stablehlo.dot_general %99, %arg8, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<8x8xf32>) -> tensor<6x8xf32>
    %101 = stablehlo.add %18, %100 : tensor<6x8xf32>
    %102 = stablehlo.multiply %101, %101 : tensor<6x8xf32>
    %103 = stablehlo.constant dense<0x00000000> : tensor<f32>
    %104 = stablehlo.reduce(%102 init: %103) across dimensions = [1] : (tensor<6x8xf32>, tensor<f32>) -> tensor<6xf32>
     reducer(%r3_a: tensor<f32>, %r3_b: tensor<f32>)  {
      %r3_c = stablehlo.add %r3_a, %r3_b : tensor<f32>
      stablehlo.return %r3_c : tensor<f32>
    }
    %105 = stablehlo.constant dense<0x41000000> : tensor<6xf32>
    %106 = stablehlo.divide %104, %105 : tensor<6xf32>
    %107 = stablehlo.constant dense<0x358637BD> : tensor<6xf32>
    %108 = stablehlo.add %106, %107 : tensor<6xf32>
    %109 = stablehlo.rsqrt %108 : tensor<6xf32>
    %110 = stablehlo.broadcast_in_dim %109, dims = [0] : (tensor<6xf32>) -> tensor<6x8xf32>
    %111 = stablehlo.multiply %101, %110 : tensor<6x8xf32>
    %112 = stablehlo.broadcast_in_dim %arg9, dims = [1] : (tensor<8xf32>) -> tensor<6x8xf32>
    %113 = stablehlo.multiply %111, %112 : tensor<6x8xf32>
    %114 = stablehlo.dot_general %113, %arg10, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<12x8xf32>) -> tensor<6x12xf32>
    %115 = stablehlo.dot_general %113, %arg11, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<12x8xf32>) -> tensor<6x12xf32>
    %116 = stablehlo.logistic %114 : tensor<6x12xf32>
    %117 = stablehlo.multiply %114, %116 : tensor<6x12xf32>
    %118 = stablehlo.multiply %117, %115 : tensor<6x12xf32>
    %119 = stablehlo.dot_general %118, %arg12, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x12xf32>, tensor<8x12xf32>) -> tensor<6x8xf32>
    %120 = stablehlo.add %101, %119 : tensor<6x8xf32>
    %121 = sdy.sharding_constraint %120 <@mesh, [{"data"}, {}]> : tensor<6x8xf32>
    %122 = stablehlo.reshape %121 : (tensor<6x8xf32>) -> tensor<2x3x8xf32>
    return %122 : tensor<2x3x8xf32>
  }
}
