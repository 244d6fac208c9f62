module @siphon_forward {
  func.func public @main(%arg0: tensor<16x8xf32>, %arg1: tensor<8xf32>, %arg2: tensor<8x8xf32>, %arg3: tensor<4x8xf32>, %arg4: tensor<4x8xf32>, %arg5: tensor<8x8xf32>, %arg6: tensor<8xf32>, %arg7: tensor<12x8xf32>, %arg8: tensor<12x8xf32>, %arg9: tensor<8x12xf32>, %arg10: tensor<2x3xi32>, %arg11: tensor<2x3xi32>, %arg12: tensor<2x3xi32>) -> (tensor<2x3x8xf32>, tensor<2x3x8xf32>) {
    %13 = stablehlo.reshape %arg10 : (tensor<2x3xi32>) -> tensor<6xi32>
    %14 = "stablehlo.gather"(%arg0, %13) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<16x8xf32>, tensor<6xi32>) -> tensor<6x8xf32>
    %15 = stablehlo.constant dense<"0x0000803F"> : tensor<1xf32>
    %16 = stablehlo.reshape %arg12 : (tensor<2x3xi32>) -> tensor<6xi32>
    %17 = stablehlo.convert %16 : (tensor<6xi32>) -> tensor<6xf32>
    %18 = stablehlo.broadcast_in_dim %17, dims = [0] : (tensor<6xf32>) -> tensor<6x1xf32>
    %19 = stablehlo.broadcast_in_dim %15, dims = [1] : (tensor<1xf32>) -> tensor<6x1xf32>
    %20 = stablehlo.multiply %18, %19 : tensor<6x1xf32>
    %21 = stablehlo.concatenate %20, %20, dim = 1 : (tensor<6x1xf32>, tensor<6x1xf32>) -> tensor<6x2xf32>
    %22 = stablehlo.cosine %21 : tensor<6x2xf32>
    %23 = stablehlo.sine %21 : tensor<6x2xf32>
    %24 = stablehlo.iota dim = 0 : tensor<3x3xi32>
    %25 = stablehlo.iota dim = 1 : tensor<3x3xi32>
    %26 = stablehlo.compare  GE, %24, %25,  SIGNED : (tensor<3x3xi32>, tensor<3x3xi32>) -> tensor<3x3xi1>
    %27 = stablehlo.broadcast_in_dim %26, dims = [1, 2] : (tensor<3x3xi1>) -> tensor<2x3x3xi1>
    %28 = stablehlo.constant dense<0> : tensor<2x3xi32>
    %29 = stablehlo.compare  NE, %arg11, %28,  SIGNED : (tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<2x3xi1>
    %30 = stablehlo.broadcast_in_dim %29, dims = [0, 2] : (tensor<2x3xi1>) -> tensor<2x3x3xi1>
    %31 = stablehlo.and %27, %30 : tensor<2x3x3xi1>
    %32 = stablehlo.multiply %14, %14 : tensor<6x8xf32>
    %33 = stablehlo.constant dense<0x00000000> : tensor<f32>
    %34 = stablehlo.reduce(%32 init: %33) across dimensions = [1] : (tensor<6x8xf32>, tensor<f32>) -> tensor<6xf32>
     reducer(%r0_a: tensor<f32>, %r0_b: tensor<f32>)  {
      %r0_c = stablehlo.add %r0_a, %r0_b : tensor<f32>
      stablehlo.return %r0_c : tensor<f32>
    }
    %35 = stablehlo.constant dense<0x41000000> : tensor<6xf32>
    %36 = stablehlo.divide %34, %35 : tensor<6xf32>
    %37 = stablehlo.constant dense<0x358637BD> : tensor<6xf32>
    %38 = stablehlo.add %36, %37 : tensor<6xf32>
    %39 = stablehlo.rsqrt %38 : tensor<6xf32>
    %40 = stablehlo.broadcast_in_dim %39, dims = [0] : (tensor<6xf32>) -> tensor<6x8xf32>
    %41 = stablehlo.multiply %14, %40 : tensor<6x8xf32>
    %42 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<8xf32>) -> tensor<6x8xf32>
    %43 = stablehlo.multiply %41, %42 : tensor<6x8xf32>
    %44 = stablehlo.dot_general %43, %arg2, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<8x8xf32>) -> tensor<6x8xf32>
    %45 = stablehlo.dot_general %43, %arg3, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<4x8xf32>) -> tensor<6x4xf32>
    %46 = stablehlo.dot_general %43, %arg4, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<4x8xf32>) -> tensor<6x4xf32>
    %47 = stablehlo.reshape %44 : (tensor<6x8xf32>) -> tensor<6x4x2xf32>
    %48 = stablehlo.reshape %45 : (tensor<6x4xf32>) -> tensor<6x2x2xf32>
    %49 = stablehlo.slice %47 [0:6, 0:4, 0:1] : (tensor<6x4x2xf32>) -> tensor<6x4x1xf32>
    %50 = stablehlo.slice %47 [0:6, 0:4, 1:2] : (tensor<6x4x2xf32>) -> tensor<6x4x1xf32>
    %51 = stablehlo.negate %50 : tensor<6x4x1xf32>
    %52 = stablehlo.concatenate %51, %49, dim = 2 : (tensor<6x4x1xf32>, tensor<6x4x1xf32>) -> tensor<6x4x2xf32>
    %53 = stablehlo.broadcast_in_dim %22, dims = [0, 2] : (tensor<6x2xf32>) -> tensor<6x4x2xf32>
    %54 = stablehlo.broadcast_in_dim %23, dims = [0, 2] : (tensor<6x2xf32>) -> tensor<6x4x2xf32>
    %55 = stablehlo.multiply %47, %53 : tensor<6x4x2xf32>
    %56 = stablehlo.multiply %52, %54 : tensor<6x4x2xf32>
    %57 = stablehlo.add %55, %56 : tensor<6x4x2xf32>
    %58 = stablehlo.slice %48 [0:6, 0:2, 0:1] : (tensor<6x2x2xf32>) -> tensor<6x2x1xf32>
    %59 = stablehlo.slice %48 [0:6, 0:2, 1:2] : (tensor<6x2x2xf32>) -> tensor<6x2x1xf32>
    %60 = stablehlo.negate %59 : tensor<6x2x1xf32>
    %61 = stablehlo.concatenate %60, %58, dim = 2 : (tensor<6x2x1xf32>, tensor<6x2x1xf32>) -> tensor<6x2x2xf32>
    %62 = stablehlo.broadcast_in_dim %22, dims = [0, 2] : (tensor<6x2xf32>) -> tensor<6x2x2xf32>
    %63 = stablehlo.broadcast_in_dim %23, dims = [0, 2] : (tensor<6x2xf32>) -> tensor<6x2x2xf32>
    %64 = stablehlo.multiply %48, %62 : tensor<6x2x2xf32>
    %65 = stablehlo.multiply %61, %63 : tensor<6x2x2xf32>
    %66 = stablehlo.add %64, %65 : tensor<6x2x2xf32>
    %67 = stablehlo.reshape %57 : (tensor<6x4x2xf32>) -> tensor<6x8xf32>
    %68 = stablehlo.reshape %66 : (tensor<6x2x2xf32>) -> tensor<6x4xf32>
    %69 = stablehlo.reshape %67 : (tensor<6x8xf32>) -> tensor<2x3x2x2x2xf32>
    %70 = stablehlo.reshape %68 : (tensor<6x4xf32>) -> tensor<2x3x2x2xf32>
    %71 = stablehlo.reshape %46 : (tensor<6x4xf32>) -> tensor<2x3x2x2xf32>
    %72 = stablehlo.dot_general %69, %70, batching_dims = [0, 2] x [0, 2], contracting_dims = [4] x [3], precision = [HIGHEST, HIGHEST] : (tensor<2x3x2x2x2xf32>, tensor<2x3x2x2xf32>) -> tensor<2x2x3x2x3xf32>
    %73 = stablehlo.constant dense<0x3F3504F3> : tensor<2x2x3x2x3xf32>
    %74 = stablehlo.multiply %72, %73 : tensor<2x2x3x2x3xf32>
    %75 = stablehlo.broadcast_in_dim %31, dims = [0, 2, 4] : (tensor<2x3x3xi1>) -> tensor<2x2x3x2x3xi1>
    %76 = stablehlo.constant dense<0xFF7FFFFF> : tensor<2x2x3x2x3xf32>
    %77 = stablehlo.select %75, %74, %76 : tensor<2x2x3x2x3xi1>, tensor<2x2x3x2x3xf32>
    %78 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %79 = stablehlo.reduce(%77 init: %78) across dimensions = [4] : (tensor<2x2x3x2x3xf32>, tensor<f32>) -> tensor<2x2x3x2xf32>
     reducer(%r1_a: tensor<f32>, %r1_b: tensor<f32>)  {
      %r1_c = stablehlo.maximum %r1_a, %r1_b : tensor<f32>
      stablehlo.return %r1_c : tensor<f32>
    }
    %80 = stablehlo.broadcast_in_dim %79, dims = [0, 1, 2, 3] : (tensor<2x2x3x2xf32>) -> tensor<2x2x3x2x3xf32>
    %81 = stablehlo.subtract %77, %80 : tensor<2x2x3x2x3xf32>
    %82 = stablehlo.exponential %81 : tensor<2x2x3x2x3xf32>
    %83 = stablehlo.constant dense<0x00000000> : tensor<f32>
    %84 = stablehlo.reduce(%82 init: %83) across dimensions = [4] : (tensor<2x2x3x2x3xf32>, tensor<f32>) -> tensor<2x2x3x2xf32>
     reducer(%r2_a: tensor<f32>, %r2_b: tensor<f32>)  {
      %r2_c = stablehlo.add %r2_a, %r2_b : tensor<f32>
      stablehlo.return %r2_c : tensor<f32>
    }
    %85 = stablehlo.broadcast_in_dim %84, dims = [0, 1, 2, 3] : (tensor<2x2x3x2xf32>) -> tensor<2x2x3x2x3xf32>
    %86 = stablehlo.divide %82, %85 : tensor<2x2x3x2x3xf32>
    %87 = stablehlo.dot_general %86, %71, batching_dims = [0, 1] x [0, 2], contracting_dims = [4] x [1], precision = [HIGHEST, HIGHEST] : (tensor<2x2x3x2x3xf32>, tensor<2x3x2x2xf32>) -> tensor<2x2x3x2x2xf32>
    %88 = stablehlo.transpose %87, dims = [0, 2, 1, 3, 4] : (tensor<2x2x3x2x2xf32>) -> tensor<2x3x2x2x2xf32>
    %89 = stablehlo.reshape %88 : (tensor<2x3x2x2x2xf32>) -> tensor<6x8xf32>
    %90 = stablehlo.dot_general %89, %arg5, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<8x8xf32>) -> tensor<6x8xf32>
    %91 = stablehlo.add %14, %90 : tensor<6x8xf32>
    %92 = stablehlo.multiply %91, %91 : tensor<6x8xf32>
    %93 = stablehlo.constant dense<0x00000000> : tensor<f32>
    %94 = stablehlo.reduce(%92 init: %93) across dimensions = [1] : (tensor<6x8xf32>, tensor<f32>) -> tensor<6xf32>
     reducer(%r3_a: tensor<f32>, %r3_b: tensor<f32>)  {
      %r3_c = stablehlo.add %r3_a, %r3_b : tensor<f32>
      stablehlo.return %r3_c : tensor<f32>
    }
    %95 = stablehlo.constant dense<0x41000000> : tensor<6xf32>
    %96 = stablehlo.divide %94, %95 : tensor<6xf32>
    %97 = stablehlo.constant dense<0x358637BD> : tensor<6xf32>
    %98 = stablehlo.add %96, %97 : tensor<6xf32>
    %99 = stablehlo.rsqrt %98 : tensor<6xf32>
    %100 = stablehlo.broadcast_in_dim %99, dims = [0] : (tensor<6xf32>) -> tensor<6x8xf32>
    %101 = stablehlo.multiply %91, %100 : tensor<6x8xf32>
    %102 = stablehlo.broadcast_in_dim %arg6, dims = [1] : (tensor<8xf32>) -> tensor<6x8xf32>
    %103 = stablehlo.multiply %101, %102 : tensor<6x8xf32>
    %104 = stablehlo.dot_general %103, %arg7, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<12x8xf32>) -> tensor<6x12xf32>
    %105 = stablehlo.dot_general %103, %arg8, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x8xf32>, tensor<12x8xf32>) -> tensor<6x12xf32>
    %106 = stablehlo.logistic %104 : tensor<6x12xf32>
    %107 = stablehlo.multiply %104, %106 : tensor<6x12xf32>
    %108 = stablehlo.multiply %107, %105 : tensor<6x12xf32>
    %109 = stablehlo.dot_general %108, %arg9, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<6x12xf32>, tensor<8x12xf32>) -> tensor<6x8xf32>
    %110 = stablehlo.add %91, %109 : tensor<6x8xf32>
    %111 = stablehlo.reshape %109 : (tensor<6x8xf32>) -> tensor<2x3x8xf32>
    %112 = stablehlo.reshape %90 : (tensor<6x8xf32>) -> tensor<2x3x8xf32>
    return %111, %112 : tensor<2x3x8xf32>, tensor<2x3x8xf32>
  }
}
